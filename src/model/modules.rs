//! `moge/model/modules.py`: the DINOv2 encoder wrapper and the convolutional decoder pieces.
//! Feature maps are (C, H, W) tensors (batch of one); 3x3 convolutions use replicate padding.

use anyhow::{bail, Result};
use candle_core::Tensor;

use super::config::{BackboneSpec, ConvStackConfig, EncoderConfig};
use super::cpu::conv1x1::{Conv1x1Op, ConvTranspose2x2Op};
use super::cpu::conv3x3::int8::QuantConv;
use super::cpu::conv3x3::Conv3x3Op;
use super::cpu::matmul::bf16::PackedA;
use super::cpu::matmul::pointwise::Pointwise;
use super::dinov2::{DinoVisionTransformer, Linear};
use super::weights::Weights;
use super::Precision;

/// `nn.Conv2d(cin, cout, 1)` as a matrix product over pixels.
pub struct Conv1x1 {
    weight: Tensor, // (cout, cin)
    bias: Tensor,   // (cout, 1)
    route: Conv1x1Route,
}

/// The ops a [`Conv1x1`] runs, chosen at load ([`super::BuildOptions`]).
enum Conv1x1Route {
    /// candle's (any device).
    Generic,
    Cpu(Box<Conv1x1Op>),
    /// In a model run in int8.
    Int8(Box<QuantConv>),
}

/// A [`QuantConv`] constructor: (weight, bias, cin, cout, level).
type NewQuantConv = fn(&[f32], Vec<f32>, usize, usize, crate::simd::isa::Isa) -> candle_core::Result<QuantConv>;

/// Whether a decoder convolution of `cin` → `cout` channels multiplies in bf16: under
/// `--precision bf16`, and under int8 on AMX where it would have run in int8 (`min` and more
/// channels): there the bf16 tiles ran every decoder shape 1.3-1.8x faster than the VNNI int8
/// kernels (`examples/conv3x3_bench`, an Intel Xeon with AMX, 2026-12-03), as attention runs
/// bf16 there too (`dinov2::Block::load`).
fn conv_bf16(w: &Weights, cin: usize, cout: usize, min: usize) -> bool {
    match w.build().precision() {
        Precision::Bf16 => true,
        Precision::Int8 => w.build().cpu_level() == Some(crate::simd::isa::Isa::Amx) && cin.min(cout) >= min,
        Precision::F32 => false,
    }
}

/// The int8 op of a decoder convolution, where `--precision int8` runs it in int8: `min` and
/// more channels in and out ([`INT8_CONV_MIN_CHANNELS`]: the stacks' 32 to 1024; those with a
/// few, the output convolutions and the neck's 2-channel inputs, stay f32), built by `new`
/// from the f32 weight as the op takes it.
fn int8_conv(w: &Weights, weight: &Tensor, bias: &Tensor, cin: usize, cout: usize, min: usize, new: NewQuantConv) -> Result<Option<Box<QuantConv>>> {
    let Some(level) = w.build().cpu_level() else { return Ok(None) };
    // Those that multiply in bf16 instead (int8 on AMX) are not int8's.
    if !(w.build().precision() == Precision::Int8 && cin.min(cout) >= min) || conv_bf16(w, cin, cout, min) {
        return Ok(None);
    }
    Ok(Some(Box::new(crate::model::cpu::with_f32(weight, |wv| new(wv, bias.to_vec1::<f32>()?, cin, cout, level))??)))
}

impl Conv1x1 {
    pub fn load(w: &mut Weights, p: &str, cin: usize, cout: usize) -> Result<Self> {
        let weight = w.get_product(&format!("{p}.weight"), &[cout, cin, 1, 1])?.reshape((cout, cin))?;
        let bias = w.get(&format!("{p}.bias"), &[cout])?;
        let route = if let Some(op) = int8_conv(w, &weight, &bias, cin, cout, INT8_POINTWISE_MIN_CHANNELS, QuantConv::new_pointwise)? {
            Conv1x1Route::Int8(op)
        } else if w.build().cpu_level().is_some() {
            let bf16 = conv_bf16(w, cin, cout, INT8_POINTWISE_MIN_CHANNELS);
            let packed = if bf16 { Some(crate::model::cpu::with_f32(&weight, |wv| PackedA::from_f32(wv, cout, cin))?) } else { None };
            let pointwise = if bf16 { None } else { crate::model::cpu::with_f32(&weight, |wv| Pointwise::new(wv, cout, cin))? };
            Conv1x1Route::Cpu(Box::new(Conv1x1Op { weight: weight.clone(), bias: bias.to_vec1()?, cin, cout, packed, pointwise }))
        } else {
            Conv1x1Route::Generic
        };
        Ok(Self { weight, bias: bias.reshape((cout, 1))?, route })
    }
    /// `residual + conv(x)`, fused on the CPU.
    pub fn forward_add(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        match &self.route {
            Conv1x1Route::Int8(op) => Ok(x.contiguous()?.apply_op2_no_bwd(&residual.contiguous()?, &op.call(false))?),
            Conv1x1Route::Cpu(op) => Ok(x.contiguous()?.apply_op2_no_bwd(&residual.contiguous()?, op.as_ref())?),
            Conv1x1Route::Generic => Ok((residual + self.forward(x)?)?),
        }
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.route {
            Conv1x1Route::Int8(op) => return Ok(x.contiguous()?.apply_op1_no_bwd(&op.call(false))?),
            Conv1x1Route::Cpu(op) => return Ok(x.contiguous()?.apply_op1_no_bwd(op.as_ref())?),
            Conv1x1Route::Generic => {}
        }
        let (c, h, wd) = x.dims3()?;
        let y = super::matmul(&self.weight, &x.reshape((c, h * wd))?, self.weight.dtype())?.broadcast_add(&self.bias)?;
        Ok(y.reshape((self.weight.dim(0)?, h, wd))?)
    }
}

/// `nn.Conv2d(cin, cout, 3, padding=1, padding_mode='replicate')`.
pub struct Conv3x3 {
    weight: Tensor, // (cout, cin, 3, 3)
    bias: Tensor,   // (1, cout, 1, 1)
    route: Conv3x3Route,
}

/// The ops a [`Conv3x3`] runs, chosen at load ([`super::BuildOptions`]).
enum Conv3x3Route {
    /// candle's (any device): conv2d, or `unfolded` as matrix products where conv2d is unusable
    /// (a CUDA build without its cuDNN) or has no bf16 (candle's CPU).
    Generic { unfolded: bool },
    /// The CPU kernel (weights kept on the host).
    Cpu(Box<Conv3x3Op>),
    /// In a model run in int8: of the calls without the upsample, or of the upsampled ones for
    /// a convolution loaded with [`Conv3x3::load_upsampling`] (the other kind runs candle's).
    Int8(Box<QuantConv>),
}

/// Channels in and out from which `--precision int8` runs a 3x3 or transposed convolution in
/// int8 ([`int8_conv`]).
const INT8_CONV_MIN_CHANNELS: usize = 32;
/// The same for the 1x1 convolutions: the heads' 32-channel inputs at full resolution (the
/// neck's last level, added to the head's) stay f32. In int8 they moved ViT-S's outputs most of
/// any layer on the test scenes (the worst relative depth error 0.0008 -> 0.0029 against f32,
/// mask IoU 0.9999 -> 0.9993; synthetic weights), and a 1x1 product of 32 channels is bound by
/// memory more than by its products.
const INT8_POINTWISE_MIN_CHANNELS: usize = 64;

impl Conv3x3 {
    pub fn load(w: &mut Weights, p: &str, cin: usize, cout: usize) -> Result<Self> {
        Self::load_with(w, p, cin, cout, false)
    }
    /// The convolution of a bilinear `Resampler`, whose every call is upsampled: its CPU op
    /// prepares the upsampled calls' own route (`Conv3x3Op::new_upsampling`).
    pub fn load_upsampling(w: &mut Weights, p: &str, cin: usize, cout: usize) -> Result<Self> {
        Self::load_with(w, p, cin, cout, true)
    }
    fn load_with(w: &mut Weights, p: &str, cin: usize, cout: usize, upsampling: bool) -> Result<Self> {
        let weight = w.get_product(&format!("{p}.weight"), &[cout, cin, 3, 3])?;
        let bias = w.get(&format!("{p}.bias"), &[cout])?;
        let new: NewQuantConv = if upsampling { QuantConv::new_upsampling } else { QuantConv::new };
        // A convolution that runs in int8 takes every call there (an upsampling one is only
        // called upsampled): no f32 weights packed beside it.
        let route = if let Some(op) = int8_conv(w, &weight, &bias, cin, cout, INT8_CONV_MIN_CHANNELS, new)? {
            Conv3x3Route::Int8(op)
        } else if w.build().cpu_level().is_some() {
            let new = if upsampling { Conv3x3Op::new_upsampling } else { Conv3x3Op::new };
            Conv3x3Route::Cpu(Box::new(new(weight.clone(), bias.to_vec1::<f32>()?, cin, cout, conv_bf16(w, cin, cout, INT8_CONV_MIN_CHANNELS))?))
        } else {
            let device = w.build().device();
            Conv3x3Route::Generic { unfolded: !crate::device::conv2d_usable(device) || (device.is_cpu() && w.build().dtype() != candle_core::DType::F32) }
        };
        Ok(Self { weight, bias: bias.reshape((1, cout, 1, 1))?, route })
    }
    /// The CPU op, if this convolution runs one.
    fn cpu_op(&self) -> Option<&Conv3x3Op> {
        match &self.route {
            Conv3x3Route::Cpu(op) => Some(op),
            _ => None,
        }
    }
    /// The int8 op for a call upsampled or not (an op serves only the one kind it was built for).
    fn int8_op(&self, upsampled: bool) -> Option<&QuantConv> {
        match &self.route {
            Conv3x3Route::Int8(op) if op.upsampling() == upsampled => Some(op),
            _ => None,
        }
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(op) = self.int8_op(false) {
            return Ok(x.contiguous()?.apply_op1_no_bwd(&op.call(false))?);
        }
        if let Some(op) = self.cpu_op() {
            return Ok(x.contiguous()?.apply_op1_no_bwd(&op.call(false, false))?);
        }
        self.generic(x)
    }
    /// conv(relu(x)), with the ReLU fused into the CPU kernel.
    pub fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(op) = self.int8_op(false) {
            return Ok(x.contiguous()?.apply_op1_no_bwd(&op.call(true))?);
        }
        if let Some(op) = self.cpu_op() {
            return Ok(x.contiguous()?.apply_op1_no_bwd(&op.call(true, false))?);
        }
        self.generic(&x.relu()?)
    }
    /// `residual + conv(relu(x))`, with the ReLU and the add fused into the CPU kernel.
    pub fn forward_relu_add(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        if let Some(op) = self.int8_op(false) {
            return Ok(x.contiguous()?.apply_op2_no_bwd(&residual.contiguous()?, &op.call(true))?);
        }
        if let Some(op) = self.cpu_op() {
            return Ok(x.contiguous()?.apply_op2_no_bwd(&residual.contiguous()?, &op.call(true, false))?);
        }
        Ok((residual + self.generic(&x.relu()?)?)?)
    }
    /// conv(upsample_bilinear_2x(x)) (align_corners=False). The CPU's direct route (bf16 or
    /// f32) computes the upsample while it reads its input, and the f32 Winograd route of an op
    /// loaded with [`Conv3x3::load_upsampling`] convolves the input itself, so the 4x larger
    /// map is never stored; elsewhere candle upsamples first.
    pub fn forward_upsampled(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(op) = self.int8_op(true) {
            return Ok(x.contiguous()?.apply_op1_no_bwd(&op.call(false))?);
        }
        if let Some(op) = self.cpu_op().filter(|op| op.fuses_upsample()) {
            return Ok(x.contiguous()?.apply_op1_no_bwd(&op.call(false, true))?);
        }
        let (_, h, w) = x.dims3()?;
        // align_corners=False at exactly 2x: weights 1/4, 3/4 with edge clamping.
        let up = x.unsqueeze(0)?.upsample_bilinear2d(2 * h, 2 * w, false)?.squeeze(0)?;
        self.forward(&up)
    }
    /// candle's own ops (any device), in the dtype of the weight, with an f32 result.
    fn generic(&self, x: &Tensor) -> Result<Tensor> {
        let dt = self.weight.dtype();
        let x = x.to_dtype(dt)?.pad_with_same(2, 1, 1)?.pad_with_same(1, 1, 1)?;
        if matches!(self.route, Conv3x3Route::Generic { unfolded: true }) {
            return self.unfolded(&x);
        }
        let y = x.unsqueeze(0)?.conv2d(&self.weight, 0, 1, 1, 1)?.to_dtype(candle_core::DType::F32)?.broadcast_add(&self.bias)?;
        Ok(y.squeeze(0)?)
    }
    /// The unfolded route on any device (its test compares it with conv2d on the CPU).
    pub fn forward_unfolded(&self, x: &Tensor) -> Result<Tensor> {
        self.unfolded(&x.pad_with_same(2, 1, 1)?.pad_with_same(1, 1, 1)?)
    }
    /// The convolution of the padded (cin, h+2, w+2) `x` as one matrix product over its nine
    /// shifted views (what candle's im2col does), for a CUDA build whose cuDNN is absent.
    fn unfolded(&self, x: &Tensor) -> Result<Tensor> {
        let (cin, hp, wp) = x.dims3()?;
        let (h, w) = (hp - 2, wp - 2);
        let cout = self.weight.dim(0)?;
        let mut taps = Vec::with_capacity(9);
        for dy in 0..3 {
            for dx in 0..3 {
                taps.push(x.narrow(1, dy, h)?.narrow(2, dx, w)?);
            }
        }
        // (cin, 9, h, w): row ci·9 + 3·dy + dx, the layout of the (cout, cin, 3, 3) weight.
        let cols = Tensor::stack(&taps, 1)?.reshape((cin * 9, h * w))?;
        let y = super::matmul(&self.weight.reshape((cout, cin * 9))?, &cols, self.weight.dtype())?.reshape((1, cout, h, w))?.broadcast_add(&self.bias)?;
        Ok(y.squeeze(0)?)
    }
}

/// `nn.ConvTranspose2d(cin, cout, 2, stride=2)`: each input pixel writes a 2x2 output block,
/// so it is one (4·cout, cin) x (cin, H·W) product followed by an interleave.
pub struct ConvTranspose2x2 {
    weight: Tensor, // (cout·2·2, cin)
    bias: Tensor,   // (cout, 1, 1, 1, 1)
    cout: usize,
    route: ConvTranspose2x2Route,
}

/// The ops a [`ConvTranspose2x2`] runs, chosen at load ([`super::BuildOptions`]).
enum ConvTranspose2x2Route {
    /// candle's (any device).
    Generic,
    Cpu(Box<ConvTranspose2x2Op>),
    /// In a model run in int8.
    Int8(Box<QuantConv>),
}

impl ConvTranspose2x2 {
    pub fn load(w: &mut Weights, p: &str, cin: usize, cout: usize) -> Result<Self> {
        let weight = w.get_product(&format!("{p}.weight"), &[cin, cout, 2, 2])?;
        let weight = weight.reshape((cin, cout * 4))?.t()?.contiguous()?;
        let bias = w.get(&format!("{p}.bias"), &[cout])?;
        let route = if let Some(op) = int8_conv(w, &weight, &bias, cin, cout, INT8_CONV_MIN_CHANNELS, QuantConv::new_transposed)? {
            ConvTranspose2x2Route::Int8(op)
        } else if w.build().cpu_level().is_some() {
            let bf16 = conv_bf16(w, cin, cout, INT8_CONV_MIN_CHANNELS);
            let packed = if bf16 { Some(crate::model::cpu::with_f32(&weight, |wv| PackedA::from_f32(wv, 4 * cout, cin))?) } else { None };
            let bias: Vec<f32> = bias.to_vec1()?;
            let pointwise = if bf16 { None } else { crate::model::cpu::with_f32(&weight, |wv| ConvTranspose2x2Op::pointwise(wv, cin, cout, &bias))? };
            ConvTranspose2x2Route::Cpu(Box::new(ConvTranspose2x2Op { weight: weight.clone(), bias, cin, cout, packed, pointwise }))
        } else {
            ConvTranspose2x2Route::Generic
        };
        Ok(Self { weight, bias: bias.reshape((cout, 1, 1, 1, 1))?, cout, route })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.route {
            ConvTranspose2x2Route::Int8(op) => return Ok(x.contiguous()?.apply_op1_no_bwd(&op.call(false))?),
            ConvTranspose2x2Route::Cpu(op) => return Ok(x.contiguous()?.apply_op1_no_bwd(op.as_ref())?),
            ConvTranspose2x2Route::Generic => {}
        }
        let (c, h, wd) = x.dims3()?;
        let y = super::matmul(&self.weight, &x.reshape((c, h * wd))?, self.weight.dtype())?; // (cout·4, h·w) as (o, di, dj, i, j)
        let y = y.reshape((self.cout, 2, 2, h, wd))?.permute((0, 3, 1, 4, 2))?; // (o, i, di, j, dj)
        let y = y.broadcast_add(&self.bias)?;
        Ok(y.reshape((self.cout, 2 * h, 2 * wd))?)
    }
}

/// `ResidualConvBlock` with norms 'none' and ReLU: x + conv_b(relu(conv_a(relu(x)))).
/// Keys: `layers.2` (conv a), `layers.5` (conv b).
pub struct ResidualConvBlock {
    conv_a: Conv3x3,
    conv_b: Conv3x3,
}

impl ResidualConvBlock {
    pub fn load(w: &mut Weights, p: &str, c: usize, hidden: usize) -> Result<Self> {
        Ok(Self { conv_a: Conv3x3::load(w, &format!("{p}.layers.2"), c, hidden)?, conv_b: Conv3x3::load(w, &format!("{p}.layers.5"), hidden, c)? })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.conv_a.forward_relu(x)?;
        self.conv_b.forward_relu_add(&y, x)
    }
}

/// `Resampler` (x2 up): transposed conv or bilinear upsample, then a 3x3 conv.
pub enum Resampler {
    ConvTranspose(Box<ConvTranspose2x2>, Conv3x3),
    Bilinear(Conv3x3),
}

impl Resampler {
    pub fn load(w: &mut Weights, p: &str, kind: &str, cin: usize, cout: usize) -> Result<Self> {
        Ok(match kind {
            "conv_transpose" => {
                Resampler::ConvTranspose(Box::new(ConvTranspose2x2::load(w, &format!("{p}.0"), cin, cout)?), Conv3x3::load(w, &format!("{p}.1"), cout, cout)?)
            }
            "bilinear" => Resampler::Bilinear(Conv3x3::load_upsampling(w, &format!("{p}.1"), cin, cout)?),
            other => bail!("unsupported resampler '{other}' (MoGe-2 uses conv_transpose and bilinear)"),
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Resampler::ConvTranspose(up, conv) => conv.forward(&up.forward(x)?),
            Resampler::Bilinear(conv) => conv.forward_upsampled(x),
        }
    }
}

/// `ConvStack`: per level, add the level's input (through a 1x1 conv), run the residual blocks,
/// emit the output (1x1 conv or identity), then upsample for the next level.
pub struct ConvStack {
    input_blocks: Vec<Option<Conv1x1>>,
    res_blocks: Vec<Vec<ResidualConvBlock>>,
    output_blocks: Vec<Option<Conv1x1>>,
    resamplers: Vec<Resampler>,
}

impl ConvStack {
    pub fn load(w: &mut Weights, p: &str, cfg: &ConvStackConfig) -> Result<Self> {
        if cfg.res_block_in_norm != "none" || cfg.res_block_hidden_norm != "none" || cfg.activation != "relu" {
            bail!(
                "{p}: unsupported residual block (norms '{}'/'{}', activation '{}'); MoGe-2 uses 'none'/'none'/'relu'",
                cfg.res_block_in_norm,
                cfg.res_block_hidden_norm,
                cfg.activation
            );
        }
        let n = cfg.levels();
        let dims = &cfg.dim_res_blocks;
        let mut input_blocks = Vec::with_capacity(n);
        let mut res_blocks = Vec::with_capacity(n);
        let mut output_blocks = Vec::with_capacity(n);
        let mut resamplers = Vec::with_capacity(n.saturating_sub(1));
        for i in 0..n {
            input_blocks.push(match cfg.dim_in.get(i).flatten() {
                Some(cin) => Some(Conv1x1::load(w, &format!("{p}.input_blocks.{i}"), cin, dims[i])?),
                None => None,
            });
            let k = cfg.num_res_blocks.get(i).unwrap_or(0);
            res_blocks.push(
                (0..k)
                    .map(|j| ResidualConvBlock::load(w, &format!("{p}.res_blocks.{i}.{j}"), dims[i], cfg.dim_times_res_block_hidden * dims[i]))
                    .collect::<Result<Vec<_>>>()?,
            );
            output_blocks.push(match cfg.dim_out.get(i).flatten() {
                Some(cout) => Some(Conv1x1::load(w, &format!("{p}.output_blocks.{i}"), dims[i], cout)?),
                None => None,
            });
            if i + 1 < n {
                let kind = cfg.resamplers.get(i).unwrap_or_default();
                resamplers.push(Resampler::load(w, &format!("{p}.resamplers.{i}"), &kind, dims[i], dims[i + 1])?);
            }
        }
        Ok(Self { input_blocks, res_blocks, output_blocks, resamplers })
    }

    /// `inputs[i]` feeds level i (None where the level has no input). Returns every level's output.
    pub fn forward(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let n = self.res_blocks.len();
        let mut outs = Vec::with_capacity(n);
        let mut x: Option<Tensor> = None;
        for i in 0..n {
            let input = inputs.get(i).copied().flatten();
            let mut cur = match (x.take(), input, &self.input_blocks[i]) {
                (Some(prev), Some(t), Some(conv)) => conv.forward_add(t, &prev)?,
                (Some(prev), Some(t), None) => (prev + t)?,
                (Some(prev), None, _) => prev,
                (None, Some(t), Some(conv)) => conv.forward(t)?,
                (None, Some(t), None) => t.clone(),
                (None, None, _) => bail!("ConvStack level {i} has no input"),
            };
            for rb in &self.res_blocks[i] {
                cur = rb.forward(&cur)?;
            }
            outs.push(match &self.output_blocks[i] {
                Some(conv) => conv.forward(&cur)?,
                None => cur.clone(),
            });
            if i + 1 < n {
                x = Some(self.resamplers[i].forward(&cur)?);
            }
        }
        Ok(outs)
    }
}

/// `MLP`: Linear, ReLU, ..., Linear (keys `.0`, `.2`, `.4`, ...).
pub struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    pub fn load(w: &mut Weights, p: &str, dims: &[usize]) -> Result<Self> {
        if dims.len() < 2 {
            bail!("{p}: an MLP needs at least two dims, got {dims:?}");
        }
        let layers = dims.windows(2).enumerate().map(|(i, d)| Linear::load(w, &format!("{p}.{}", 2 * i), d[0], d[1])).collect::<Result<Vec<_>>>()?;
        Ok(Self { layers })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            x = l.forward(&x)?;
            if i + 1 < self.layers.len() {
                x = x.relu()?;
            }
        }
        Ok(x)
    }
}

/// `DINOv2Encoder`: backbone taps, each projected by a 1x1 conv, summed. The input resize
/// and normalisation happen on the host (see `crate::model::Model::prepare`).
pub struct Dinov2Encoder {
    pub backbone: DinoVisionTransformer,
    pub taps: Vec<usize>,
    output_projections: Vec<Conv1x1>,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    /// On the CPU kernels: the taps transposed by [`crate::model::cpu::tensor::Transpose`].
    cpu: bool,
}

/// What the encoder produced, kept for per-stage comparisons.
pub struct EncoderOutput {
    /// Normed tokens (1 + h·w, D) after each tapped block.
    pub taps: Vec<Tensor>,
    /// (dim_out, h, w)
    pub features: Tensor,
    /// (1, D): class token of the last tap.
    pub cls_token: Tensor,
}

impl Dinov2Encoder {
    pub fn load(w: &mut Weights, cfg: &EncoderConfig, spec: &BackboneSpec) -> Result<Self> {
        let (dim, depth) = (spec.embed_dim, spec.depth);
        let buf3 = |w: &mut Weights, k: &str| -> Result<[f32; 3]> {
            let v = w.get(k, &[1, 3, 1, 1])?.flatten_all()?.to_vec1::<f32>()?;
            Ok([v[0], v[1], v[2]])
        };
        let image_mean = buf3(w, "encoder.image_mean")?;
        let image_std = buf3(w, "encoder.image_std")?;
        let backbone = DinoVisionTransformer::load(w, "encoder.backbone", spec)?;
        let taps = cfg.intermediate_layers.indices(depth);
        if let Some(bad) = taps.iter().find(|&&t| t >= depth) {
            bail!("intermediate layer {bad} does not exist in a {depth}-block backbone");
        }
        let output_projections =
            (0..taps.len()).map(|k| Conv1x1::load(w, &format!("encoder.output_projections.{k}"), dim, cfg.dim_out)).collect::<Result<Vec<_>>>()?;
        let cpu = matches!(w.build().ops(), super::Ops::Cpu(_));
        Ok(Self { backbone, taps, output_projections, image_mean, image_std, cpu })
    }

    /// `image` is the normalised (3, 14h, 14w) input; `pos_embed` the embedding for (h, w).
    pub fn forward(&self, image: &Tensor, h: usize, w: usize, pos_embed: &Tensor) -> Result<EncoderOutput> {
        let x = self.backbone.prepare_tokens(image, h, w, pos_embed)?;
        let taps = self.backbone.intermediate_layers(x, &self.taps)?;
        let mut features: Option<Tensor> = None;
        for (proj, t) in self.output_projections.iter().zip(&taps) {
            let tokens = t.narrow(0, 1, h * w)?;
            let patches = if self.cpu { tokens.contiguous()?.apply_op1_no_bwd(&crate::model::cpu::tensor::Transpose)? } else { tokens.t()?.contiguous()? };
            let patches = patches.reshape((self.backbone.embed_dim, h, w))?;
            let y = proj.forward(&patches)?;
            features = Some(match features {
                None => y,
                Some(f) => (f + y)?,
            });
        }
        let features = features.ok_or_else(|| anyhow::anyhow!("the encoder taps no layer"))?;
        let cls_token = taps.last().unwrap().narrow(0, 0, 1)?;
        Ok(EncoderOutput { taps, features, cls_token })
    }
}
