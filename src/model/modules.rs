//! `moge/model/modules.py`: the DINOv2 encoder wrapper and the convolutional decoder pieces.
//! Feature maps are (C, H, W) tensors (batch of one); 3x3 convolutions use replicate padding.

use anyhow::{bail, Result};
use candle_core::Tensor;

use super::build::BuildOptions;
use super::config::{BackboneSpec, ConvStackConfig, EncoderConfig};
use super::cpu::conv1x1::{Conv1x1Op, ConvTranspose2x2Op};
use super::cpu::conv3x3::int8::QuantConv;
use super::cpu::conv3x3::tiles::{Kind, TileConv};
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

/// Whether a decoder convolution of `cin` → `cout` channels that does not run in int8
/// ([`int8_conv`]) multiplies in bf16: under `--precision bf16`, and under int8 on AMX where
/// `min` and more channels would run in int8 (the 1x1 and transposed ones, the 3x3 ones of
/// fewer than [`INT8_TILES_MIN_CIN`] inputs, and a [`FoldedTail`]'s few outputs from such a
/// map), as attention runs bf16 there too (`dinov2::Block::load`).
fn conv_bf16(build: &BuildOptions, cin: usize, cout: usize, min: usize) -> bool {
    match build.precision() {
        Precision::Bf16 => true,
        Precision::Int8 => build.cpu_level() == Some(crate::simd::isa::Isa::Amx) && cin.min(cout) >= min,
        Precision::F32 => false,
    }
}

/// Whether a bf16 transposed or 1x1 convolution of `cin` → `cout` channels runs on AMX tiles
/// ([`TileConv::new_transposed`], [`TileConv::new_pointwise`]): on the `amx` level, from 16
/// channels each way.
fn on_tiles(build: &BuildOptions, cin: usize, cout: usize) -> bool {
    build.cpu_level() == Some(crate::simd::isa::Isa::Amx) && cin.min(cout) >= 16
}

/// Input channels up to which a bf16 1x1 convolution runs on one-tap tiles rather than the
/// tile GEMM, whose packing of the map bounds it at few channels: with the residual, 64 -> 64
/// at 280x416 3.1-3.3 -> 2.3 ms, 128 at 140x208 1.53-1.58 -> 1.46 ms, 256 at 70x104 0.97 ->
/// 1.04-1.08 ms (an Intel Xeon with AMX, 2 threads, 2026-12-07).
const POINTWISE_TILES_MAX_CIN: usize = 128;

/// The int8 op of a decoder convolution, where `--precision int8` runs it in int8: `min` and
/// more channels in and out ([`INT8_CONV_MIN_CHANNELS`]: the stacks' 32 to 1024; those with a
/// few, the output convolutions and the neck's 2-channel inputs, stay f32), built by `new`
/// from the f32 weight as the op takes it. On AMX only the 3x3 ones (`taps` 9) of
/// [`INT8_TILES_MIN_CIN`] and more inputs: the 1x1 and transposed ones (one tap) ran slower
/// on the int8 tiles than in bf16, their per-pixel quantisation and scaling costing more than
/// the products saved (1x1 with the residual, bf16 tile GEMM / one-tap bf16 tiles / int8 tiles:
/// 1024 channels at 35x52 2.16 / 3.49 / 2.42 ms, 256 at 70x104 1.10 / 1.09 / 1.21, 128 at
/// 140x208 1.47 / 1.34 / 1.83, 64 at 280x416 3.06 / 2.23 / 3.81; `examples/planes_bench`, an
/// Intel Xeon with AMX, 2 threads, 2026-12-07).
#[allow(clippy::too_many_arguments)]
fn int8_conv(
    build: &BuildOptions,
    weight: &Tensor,
    bias: &Tensor,
    cin: usize,
    cout: usize,
    min: usize,
    taps: usize,
    new: NewQuantConv,
) -> Result<Option<Box<QuantConv>>> {
    let Some(level) = build.cpu_level() else { return Ok(None) };
    let amx = level == crate::simd::isa::Isa::Amx;
    if !(build.precision() == Precision::Int8 && cin.min(cout) >= min) || (amx && (taps == 1 || cin < INT8_TILES_MIN_CIN)) {
        return Ok(None);
    }
    Ok(Some(Box::new(crate::model::cpu::with_f32(weight, |wv| new(wv, bias.to_vec1::<f32>()?, cin, cout, level))??)))
}

impl Conv1x1 {
    pub fn load(w: &mut Weights, p: &str, cin: usize, cout: usize) -> Result<Self> {
        let weight = w.get_product(&format!("{p}.weight"), &[cout, cin, 1, 1])?.reshape((cout, cin))?;
        let bias = w.get(&format!("{p}.bias"), &[cout])?;
        Self::new(w.build(), weight, bias, cin, cout)
    }
    /// From its (cout, cin) weight in the products' dtype and its (cout) f32 bias, on the
    /// model's device.
    fn new(build: &BuildOptions, weight: Tensor, bias: Tensor, cin: usize, cout: usize) -> Result<Self> {
        let route = if let Some(op) = int8_conv(build, &weight, &bias, cin, cout, INT8_POINTWISE_MIN_CHANNELS, 1, QuantConv::new_pointwise)? {
            Conv1x1Route::Int8(op)
        } else if build.cpu_level().is_some() {
            let bf16 = conv_bf16(build, cin, cout, INT8_POINTWISE_MIN_CHANNELS);
            let tiles = if bf16 && on_tiles(build, cin, cout) && cin <= POINTWISE_TILES_MAX_CIN {
                Some(crate::model::cpu::with_f32(&weight, |wv| TileConv::new_pointwise(wv, cin, cout, Kind::Bf16, false))?)
            } else {
                None
            };
            let packed = if bf16 && tiles.is_none() { Some(crate::model::cpu::with_f32(&weight, |wv| PackedA::from_f32(wv, cout, cin))?) } else { None };
            let pointwise = if bf16 { None } else { crate::model::cpu::with_f32(&weight, |wv| Pointwise::new(wv, cout, cin))? };
            Conv1x1Route::Cpu(Box::new(Conv1x1Op { weight: weight.clone(), bias: bias.to_vec1()?, cin, cout, packed, pointwise, tiles }))
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

/// Input channels from which int8 on AMX runs a convolution on the int8 tiles; below, on the
/// bf16 tiles. A tile's K is 64 channels in int8 and 32 in bf16, so 32 channels fill half an
/// int8 tile with zeros and do as many tile products as bf16, with the band's quantisation on
/// top: 32 -> 32 at 480x640 ran 3.39 ms in bf16 and 5.09 ms in int8, 64 -> 64 at 240x320 2.80
/// and 2.38 ms (an Intel Xeon with AMX, 2 threads, 2026-12-07).
const INT8_TILES_MIN_CIN: usize = 64;

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
        Self::new(w.build(), weight, bias, cin, cout, upsampling, false)
    }
    /// From its (cout, cin, 3, 3) weight in the products' dtype and its (cout) f32 bias, on the
    /// model's device; `upsampling` as [`Conv3x3::load_upsampling`]. `folded`: a
    /// [`FoldedTail`]'s, a few outputs from a map of `cin` channels, which multiplies in bf16
    /// where the convolutions of `cin` channels do (under int8 on AMX too), else in f32.
    fn new(build: &BuildOptions, weight: Tensor, bias: Tensor, cin: usize, cout: usize, upsampling: bool, folded: bool) -> Result<Self> {
        let new: NewQuantConv = if upsampling { QuantConv::new_upsampling } else { QuantConv::new };
        let int8 = if folded { None } else { int8_conv(build, &weight, &bias, cin, cout, INT8_CONV_MIN_CHANNELS, 9, new)? };
        // A convolution that runs in int8 takes every call there (an upsampling one is only
        // called upsampled): no f32 weights packed beside it.
        let route = if let Some(op) = int8 {
            Conv3x3Route::Int8(op)
        } else if build.cpu_level().is_some() {
            let new = if upsampling { Conv3x3Op::new_upsampling } else { Conv3x3Op::new };
            let bf16 = conv_bf16(build, cin, if folded { cin } else { cout }, INT8_CONV_MIN_CHANNELS);
            Conv3x3Route::Cpu(Box::new(new(weight.clone(), bias.to_vec1::<f32>()?, cin, cout, bf16)?))
        } else {
            let device = build.device();
            Conv3x3Route::Generic { unfolded: !crate::device::conv2d_usable(device) || (device.is_cpu() && build.dtype() != candle_core::DType::F32) }
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
        let route = if let Some(op) = int8_conv(w.build(), &weight, &bias, cin, cout, INT8_CONV_MIN_CHANNELS, 1, QuantConv::new_transposed)? {
            ConvTranspose2x2Route::Int8(op)
        } else if w.build().cpu_level().is_some() {
            let bf16 = conv_bf16(w.build(), cin, cout, INT8_CONV_MIN_CHANNELS);
            let tiles = if bf16 && on_tiles(w.build(), cin, cout) {
                Some(crate::model::cpu::with_f32(&weight, |wv| TileConv::new_transposed(wv, cin, cout, Kind::Bf16, false))?)
            } else {
                None
            };
            let packed = if bf16 && tiles.is_none() { Some(crate::model::cpu::with_f32(&weight, |wv| PackedA::from_f32(wv, 4 * cout, cin))?) } else { None };
            let bias: Vec<f32> = bias.to_vec1()?;
            let pointwise = if bf16 { None } else { crate::model::cpu::with_f32(&weight, |wv| ConvTranspose2x2Op::pointwise(wv, cin, cout, &bias))? };
            ConvTranspose2x2Route::Cpu(Box::new(ConvTranspose2x2Op { weight: weight.clone(), bias, cin, cout, packed, pointwise, tiles }))
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
    /// The whole stack, as upstream runs it.
    pub fn load(w: &mut Weights, p: &str, cfg: &ConvStackConfig) -> Result<Self> {
        Self::load_levels(w, p, cfg, cfg.levels())
    }

    /// The stack without its last level, and that level's linear parts on the host
    /// ([`LinearTail`]) for a [`FoldedTail`]; `None` where the last level is not linear from
    /// the previous level's map to its output (nothing is read then).
    pub fn load_without_tail(w: &mut Weights, p: &str, cfg: &ConvStackConfig, head: bool) -> Result<Option<(Self, LinearTail)>> {
        let n = cfg.levels();
        if !LinearTail::folds(cfg, head) {
            return Ok(None);
        }
        let stack = Self::load_levels(w, p, cfg, n - 1)?;
        let last = n - 1;
        let (c, prev) = (cfg.dim_res_blocks[last], cfg.dim_res_blocks[last - 1]);
        let conv = (w.host(&format!("{p}.resamplers.{}.1.weight", last - 1), &[c, prev, 3, 3])?, w.host(&format!("{p}.resamplers.{}.1.bias", last - 1), &[c])?);
        // A 1x1 block's (channels, weight, bias), from `cin` to `cout`; `channels` the side
        // that is not `c`.
        let one_by_one = |w: &mut Weights, block: &str, cin: usize, cout: usize, channels: usize| -> Result<(usize, Vec<f32>, Vec<f32>)> {
            let key = format!("{p}.{block}.{last}");
            Ok((channels, w.host(&format!("{key}.weight"), &[cout, cin, 1, 1])?, w.host(&format!("{key}.bias"), &[cout])?))
        };
        let input = cfg.dim_in.get(last).flatten().map(|cin| one_by_one(w, "input_blocks", cin, c, cin)).transpose()?;
        let output = cfg.dim_out.get(last).flatten().map(|cout| one_by_one(w, "output_blocks", c, cout, cout)).transpose()?;
        Ok(Some((stack, LinearTail { channels: c, prev, conv, input, output })))
    }

    /// Levels `0..levels` of the stack (the resamplers between them).
    fn load_levels(w: &mut Weights, p: &str, cfg: &ConvStackConfig, levels: usize) -> Result<Self> {
        if cfg.res_block_in_norm != "none" || cfg.res_block_hidden_norm != "none" || cfg.activation != "relu" {
            bail!(
                "{p}: unsupported residual block (norms '{}'/'{}', activation '{}'); MoGe-2 uses 'none'/'none'/'relu'",
                cfg.res_block_in_norm,
                cfg.res_block_hidden_norm,
                cfg.activation
            );
        }
        let n = levels;
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
        Ok(self.forward_with_last(inputs)?.0)
    }

    /// As [`ConvStack::forward`], with the last level's map before its output block (what the
    /// next level would be resampled from: a [`FoldedTail`]'s input).
    pub fn forward_with_last(&self, inputs: &[Option<&Tensor>]) -> Result<(Vec<Tensor>, Tensor)> {
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
            } else {
                return Ok((outs, cur));
            }
        }
        bail!("a ConvStack of no levels")
    }
}

/// A 1x1 or 3x3 convolution's weight and bias as f32 on the host.
type HostConv = (Vec<f32>, Vec<f32>);

/// The last level of a [`ConvStack`] where it is linear in the previous level's map: the
/// bilinear resampler's 3x3 convolution (`conv`, `prev` → `channels`), the level's input
/// block (a 1x1 from `cin` channels, or none), no residual blocks, and the output block (a 1x1
/// to `cout` channels, or the identity).
pub struct LinearTail {
    channels: usize,
    prev: usize,
    conv: HostConv,
    input: Option<(usize, Vec<f32>, Vec<f32>)>,
    output: Option<(usize, Vec<f32>, Vec<f32>)>,
}

impl LinearTail {
    /// Whether the last level of a stack of `cfg` is linear, with an input block for the neck
    /// (`head` false: its UV) and an output block for a head.
    pub fn folds(cfg: &ConvStackConfig, head: bool) -> bool {
        let n = cfg.levels();
        let last = n.wrapping_sub(1);
        n >= 2
            && cfg.resamplers.get(last - 1).unwrap_or_default() == "bilinear"
            && cfg.num_res_blocks.get(last).unwrap_or(0) == 0
            && if head {
                cfg.dim_out.get(last).flatten().is_some()
            } else {
                cfg.dim_out.get(last).flatten().is_none() && cfg.dim_in.get(last).flatten().is_some()
            }
    }
}

/// The decoder's full-resolution level, folded at load. There MoGe-2's neck and heads are
/// linear from their previous levels' maps to the heads' outputs (`ConvStack` in
/// `moge/model/modules.py`: a bilinear upsample, a 3x3 convolution, the input block added, no
/// residual blocks, the output 1x1), so each head's output is
///
/// `W2·W1·Cn(up(n)) + W2·Ch(up(h)) + W2·W1·Wn·uv + W2·W1·(bn + cn) + W2·(b1 + ch) + b2`
///
/// (neck: `Cn`, `cn` its last resampler's convolution, `Wn`, `bn` the 1x1 of its UV input;
/// head: `Ch`, `ch` its resampler's, `W1`, `b1` its input block, `W2`, `b2` its output
/// block). The 32-channel maps at full resolution (the neck's, and each head's twice) are never
/// made: one upsampled convolution from the neck's previous map to every head's outputs (seven
/// channels for three heads), one from each head's map to its own, and the UV term. The same
/// numbers as upstream's order up to rounding (`tests/it/parity.rs`,
/// `the_folded_decoder_matches_the_unfolded_one`); bf16 and int8 fold, f32 does not
/// ([`BuildOptions::with_fold`]).
pub struct FoldedTail {
    /// From the neck's previous map (upsampled) to every head's outputs, stacked; no bias.
    neck: Conv3x3,
    /// Per head: its rows in `neck`'s output, its convolution (upsampled, every constant in its
    /// bias) and its UV term (a 1x1 of the level's UV, no bias).
    heads: Vec<(usize, usize, Conv3x3, Conv1x1)>,
}

impl FoldedTail {
    /// From the neck's and the heads' [`LinearTail`]s (the heads' in their output order).
    pub fn new(build: &BuildOptions, neck: &LinearTail, heads: &[LinearTail]) -> Result<Self> {
        let (cn, pn) = (neck.channels, neck.prev);
        let Some((uv_in, wn, bn)) = &neck.input else { bail!("the neck's last level has no input block") };
        let total: usize = heads.iter().map(|h| h.output.as_ref().map_or(0, |o| o.0)).sum();
        let mut neck_w = vec![0f64; total * pn * 9];
        let mut parts = Vec::with_capacity(heads.len());
        let mut row = 0;
        for h in heads {
            let Some((k, w2, b2)) = &h.output else { bail!("a head's last level has no output block") };
            let (k, c) = (*k, h.channels);
            // A = W2·W1 (k × cn), the identity for a head without an input block.
            let a: Vec<f64> = match &h.input {
                Some((cin, w1, _)) => {
                    if *cin != cn {
                        bail!("a head's last input block takes {cin} channels, the neck gives {cn}");
                    }
                    matmul64(w2, w1, k, c, cn)
                }
                None if c == cn => w2.iter().map(|&v| v as f64).collect(),
                None => bail!("a head of {c} channels adds the neck's {cn} without an input block"),
            };
            // The neck's convolution, through A, into rows row..row + k.
            let an = matmul64(&a, &neck.conv.0, k, cn, pn * 9);
            neck_w[row * pn * 9..(row + k) * pn * 9].copy_from_slice(&an);
            // The head's convolution through W2, with every constant in its bias.
            let head_w = matmul64(w2, &h.conv.0, k, c, h.prev * 9);
            let b1: Vec<f64> = match &h.input {
                Some((_, _, b1)) => b1.iter().map(|&v| v as f64).collect(),
                None => vec![0.0; c],
            };
            let mut bias = vec![0f64; k];
            for o in 0..k {
                let mut acc = b2[o] as f64;
                for j in 0..cn {
                    acc += a[o * cn + j] * (bn[j] as f64 + neck.conv.1[j] as f64);
                }
                for j in 0..c {
                    acc += w2[o * c + j] as f64 * (b1[j] + h.conv.1[j] as f64);
                }
                bias[o] = acc;
            }
            let uv_w = matmul64(&a, wn, k, cn, *uv_in);
            let head_conv = Conv3x3::new(build, product(build, &head_w, &[k, h.prev, 3, 3])?, f32_tensor(build, &bias, &[k])?, h.prev, k, true, true)?;
            let uv = Conv1x1::new(build, product(build, &uv_w, &[k, *uv_in])?, f32_tensor(build, &vec![0.0; k], &[k])?, *uv_in, k)?;
            parts.push((row, k, head_conv, uv));
            row += k;
        }
        let neck = Conv3x3::new(build, product(build, &neck_w, &[total, pn, 3, 3])?, f32_tensor(build, &vec![0.0; total], &[total])?, pn, total, true, true)?;
        Ok(Self { neck, heads: parts })
    }

    /// The part every head shares, from the neck's previous map (the map its last resampler
    /// takes): each head's rows of `W2·W1·Cn(up(n))`.
    pub fn shared(&self, neck: &Tensor) -> Result<Tensor> {
        self.neck.forward_upsampled(neck)
    }

    /// Head `i`'s output from [`FoldedTail::shared`], its own previous map and the level's
    /// (2, H, W) UV.
    pub fn head(&self, i: usize, shared: &Tensor, prev: &Tensor, uv: &Tensor) -> Result<Tensor> {
        let Some((row, k, conv, uv_conv)) = self.heads.get(i) else { bail!("no head {i} in the folded decoder") };
        let own = (conv.forward_upsampled(prev)? + shared.narrow(0, *row, *k)?)?;
        uv_conv.forward_add(uv, &own)
    }
}

/// `a` (m × k) · `b` (k × n) in f64, each of f32 or f64.
fn matmul64<A: Copy + Into<f64>, B: Copy + Into<f64>>(a: &[A], b: &[B], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let av: f64 = a[i * k + p].into();
            for (cv, &bv) in c[i * n..(i + 1) * n].iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *cv += av * bv.into();
            }
        }
    }
    c
}

/// A product's weight made at load, in the products' dtype on the model's device.
fn product(build: &BuildOptions, v: &[f64], shape: &[usize]) -> Result<Tensor> {
    Ok(f32_tensor(build, v, shape)?.to_dtype(build.dtype())?)
}

/// f32 values made at load, on the model's device.
fn f32_tensor(build: &BuildOptions, v: &[f64], shape: &[usize]) -> Result<Tensor> {
    Ok(Tensor::from_vec(v.iter().map(|&x| x as f32).collect::<Vec<_>>(), shape, &candle_core::Device::Cpu)?.to_device(build.device())?)
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
