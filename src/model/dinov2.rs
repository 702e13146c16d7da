//! DINOv2 ViT (`moge/model/dinov2/models/vision_transformer.py` and `layers/`), inference path
//! only: no registers, no block chunking, LayerScale on, exact-erf GELU, LayerNorm eps 1e-6.
//! Tokens are kept as a (N, D) matrix: the batch is one image.

use anyhow::Result;
use candle_core::{DType, Module, Tensor};

use std::sync::Arc;

use super::cpu::attention::AttentionOp;
use super::cpu::linear::{Epilogue, F32Weight, LinearOp, Packed, ScaledResidualOp};
use super::cpu::matmul::bf16::PackedB;
use super::cpu::matmul::int8::QuantB;
use super::weights::Weights;
use crate::simd::isa::{self, Isa};
use crate::simd::sgemm::Panels;

/// The linears of a block that `--precision int8` runs as int8 products (`Linear::load_block`),
/// by their names in the state dict under `blocks.N.`.
pub const INT8_LINEARS: [&str; 4] = ["attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"];

pub const PATCH_SIZE: usize = 14;
/// Position embeddings are trained for a 37x37 grid (518 / 14).
pub const POS_GRID: usize = 37;
const LN_EPS: f64 = 1e-6;

pub struct Linear {
    /// PyTorch's (out, in); products read it transposed through strides. `None` where the CPU
    /// kernels hold it packed instead (`F32Weight::Panels`, bf16 or int8): one copy of the
    /// weights in memory.
    weight: Option<Tensor>,
    dtype: DType,
    bias: Tensor,
    cpu: Option<[LinearOp; 2]>,
}

impl Linear {
    /// A linear of a head: f32, or bf16 where the model runs in bf16 (int8 keeps it f32).
    pub fn load(w: &mut Weights, prefix: &str, d_in: usize, d_out: usize) -> Result<Self> {
        Self::load_as(w, prefix, d_in, d_out, false)
    }

    /// A linear of a transformer block (qkv, proj, fc1, fc2): int8 where the model is.
    pub fn load_block(w: &mut Weights, prefix: &str, d_in: usize, d_out: usize) -> Result<Self> {
        Self::load_as(w, prefix, d_in, d_out, true)
    }

    fn load_as(w: &mut Weights, prefix: &str, d_in: usize, d_out: usize, int8: bool) -> Result<Self> {
        let weight = w.get_product(&format!("{prefix}.weight"), &[d_out, d_in])?;
        let bias = w.get(&format!("{prefix}.bias"), &[d_out])?;
        let cpu = if w.cpu_kernels() {
            let b: Vec<f32> = bias.to_vec1()?;
            let packed = if w.bf16() {
                Some(Packed::Bf16(Arc::new(super::cpu::with_f32(&weight, |wv| PackedB::from_f32_nk(wv, d_out, d_in))?)))
            } else if int8 && w.int8() && super::cpu::enabled() {
                Some(Packed::Int8(Arc::new(super::cpu::with_f32(&weight, |wv| QuantB::from_f32_nk(wv, d_out, d_in, isa::current()))?)))
            } else {
                None
            };
            // The packed weight (bf16 or int8) is the op's only one where the kernels run
            // (`cpu::enabled`, fixed for the process): no f32 copy beside it. Without the
            // kernels the op is never called, and the model's tensor is kept for candle's.
            let f32_weight = if packed.is_some() && super::cpu::enabled() {
                F32Weight::InPacked
            } else if packed.is_none() && Panels::available(isa::current()) && super::cpu::enabled() {
                F32Weight::Panels(Arc::new(super::cpu::with_f32(&weight, |wv| Panels::new(wv, d_in, d_out, 1, d_in))?))
            } else {
                F32Weight::Tensor(weight.clone())
            };
            let op = |epilogue| LinearOp { weight: f32_weight.clone(), bias: b.clone(), d_in, d_out, epilogue, packed: packed.clone(), isa: isa::current() };
            Some([op(Epilogue::Bias), op(Epilogue::BiasGelu)])
        } else {
            None
        };
        let dtype = weight.dtype();
        // Held in another form by the kernels alone: f32 panels, bf16 or int8.
        let held = matches!(&cpu, Some([LinearOp { weight: F32Weight::Panels(_) | F32Weight::InPacked, .. }, _]));
        if held {
            w.release(&format!("{prefix}.weight"));
        }
        Ok(Self { weight: (!held).then_some(weight), dtype, bias, cpu })
    }
    fn cpu_op(&self, x: &Tensor, gelu: bool) -> Option<&LinearOp> {
        self.cpu.as_ref().filter(|_| x.device().is_cpu() && super::cpu::enabled()).map(|ops| &ops[gelu as usize])
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(op) = self.cpu_op(x, false) {
            return Ok(x.contiguous()?.apply_op1_no_bwd(op)?);
        }
        let Some(weight) = &self.weight else {
            // The packed route is taken on the CPU with the kernels on, which is where x is.
            anyhow::bail!("linear: the weights are packed for the CPU kernels, the input is on {:?}", x.device());
        };
        Ok(super::matmul(x, &weight.t()?, self.dtype)?.broadcast_add(&self.bias)?)
    }
    /// GELU(linear(x)), exact erf.
    pub fn forward_gelu(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(op) = self.cpu_op(x, true) {
            return Ok(x.contiguous()?.apply_op1_no_bwd(op)?);
        }
        Ok(self.forward(x)?.gelu_erf()?)
    }
}

/// x + gamma ⊙ y: LayerScale and the residual add.
fn scaled_residual(x: &Tensor, y: &Tensor, gamma: &(Tensor, Option<ScaledResidualOp>)) -> Result<Tensor> {
    if let (Some(op), true) = (&gamma.1, x.device().is_cpu() && super::cpu::enabled()) {
        return Ok(x.contiguous()?.apply_op2_no_bwd(&y.contiguous()?, op)?);
    }
    Ok((x + y.broadcast_mul(&gamma.0)?)?)
}

pub struct LayerNorm {
    inner: candle_nn::LayerNorm,
}

impl LayerNorm {
    pub fn load(w: &mut Weights, prefix: &str, dim: usize) -> Result<Self> {
        let weight = w.get(&format!("{prefix}.weight"), &[dim])?;
        let bias = w.get(&format!("{prefix}.bias"), &[dim])?;
        Ok(Self { inner: candle_nn::LayerNorm::new(weight, bias, LN_EPS) })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.inner.forward(x)?)
    }
}

/// `layers/attention.py`: fused qkv projection, softmax(q kᵀ / √64) v per head, output projection.
pub struct Attention {
    qkv: Linear,
    proj: Linear,
    num_heads: usize,
    bf16: bool,
    /// Whether the CPU kernel applies (f32 weights on the CPU).
    cpu: bool,
    /// The CPU kernel's level, chosen when the model is built.
    isa: Isa,
}

impl Attention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (n, d) = x.dims2()?;
        let hd = d / self.num_heads;
        if self.cpu && x.device().is_cpu() && super::cpu::enabled() {
            let qkv = self.qkv.forward(x)?.contiguous()?;
            let out = qkv.apply_op1_no_bwd(&AttentionOp { num_heads: self.num_heads, bf16: self.bf16, isa: self.isa })?;
            return self.proj.forward(&out);
        }
        let qkv = self.qkv.forward(x)?.reshape((n, 3, self.num_heads, hd))?.permute((1, 2, 0, 3))?;
        let scale = 1.0 / (hd as f64).sqrt();
        let q = (qkv.get(0)?.contiguous()? * scale)?;
        let k = qkv.get(1)?.contiguous()?;
        let v = qkv.get(2)?.contiguous()?;
        // The products in the dtype of the weights (bf16 on a GPU), softmax in f32.
        let dt = self.qkv.dtype;
        let att = super::matmul(&q, &k.t()?, dt)?;
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        let out = super::matmul(&att, &v, dt)?; // (heads, n, hd)
        let out = out.permute((1, 0, 2))?.reshape((n, d))?;
        self.proj.forward(&out)
    }
}

/// `layers/block.py` eval path: x + ls1·attn(norm1 x), then x + ls2·mlp(norm2 x).
pub struct Block {
    norm1: LayerNorm,
    attn: Attention,
    ls1: (Tensor, Option<ScaledResidualOp>),
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    ls2: (Tensor, Option<ScaledResidualOp>),
}

fn layer_scale(w: &mut Weights, key: &str, dim: usize) -> Result<(Tensor, Option<ScaledResidualOp>)> {
    let g = w.get(key, &[dim])?;
    let op = if w.cpu_kernels() { Some(ScaledResidualOp { gamma: g.to_vec1()? }) } else { None };
    Ok((g, op))
}

impl Block {
    fn load(w: &mut Weights, p: &str, dim: usize, num_heads: usize) -> Result<Self> {
        Ok(Self {
            norm1: LayerNorm::load(w, &format!("{p}.norm1"), dim)?,
            attn: Attention {
                qkv: Linear::load_block(w, &format!("{p}.{}", INT8_LINEARS[0]), dim, 3 * dim)?,
                proj: Linear::load_block(w, &format!("{p}.{}", INT8_LINEARS[1]), dim, dim)?,
                num_heads,
                bf16: w.bf16(),
                cpu: w.cpu_kernels(),
                isa: isa::current(),
            },
            ls1: layer_scale(w, &format!("{p}.ls1.gamma"), dim)?,
            norm2: LayerNorm::load(w, &format!("{p}.norm2"), dim)?,
            fc1: Linear::load_block(w, &format!("{p}.{}", INT8_LINEARS[2]), dim, 4 * dim)?,
            fc2: Linear::load_block(w, &format!("{p}.{}", INT8_LINEARS[3]), 4 * dim, dim)?,
            ls2: layer_scale(w, &format!("{p}.ls2.gamma"), dim)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let a = self.attn.forward(&self.norm1.forward(x)?)?;
        let x = scaled_residual(x, &a, &self.ls1)?;
        let h = self.fc1.forward_gelu(&self.norm2.forward(&x)?)?;
        let m = self.fc2.forward(&h)?;
        scaled_residual(&x, &m, &self.ls2)
    }
}

pub struct DinoVisionTransformer {
    pub embed_dim: usize,
    patch_weight_t: Tensor,
    patch_bias: Tensor,
    cls_token: Tensor,
    /// (1 + 37·37, D), kept on the host side for the bicubic resize.
    pub pos_embed: Tensor,
    blocks: Vec<Block>,
    norm: LayerNorm,
}

impl DinoVisionTransformer {
    pub fn load(w: &mut Weights, p: &str, dim: usize, depth: usize, num_heads: usize) -> Result<Self> {
        let patch_weight = w.get_product(&format!("{p}.patch_embed.proj.weight"), &[dim, 3, PATCH_SIZE, PATCH_SIZE])?;
        let patch_bias = w.get(&format!("{p}.patch_embed.proj.bias"), &[dim])?;
        let cls_token = w.get(&format!("{p}.cls_token"), &[1, 1, dim])?.reshape((1, dim))?;
        let pos_embed = w.get(&format!("{p}.pos_embed"), &[1, 1 + POS_GRID * POS_GRID, dim])?.reshape((1 + POS_GRID * POS_GRID, dim))?;
        // Only used for masked pre-training; bound so that the key check stays strict.
        let _mask_token = w.get(&format!("{p}.mask_token"), &[1, dim])?;
        let blocks = (0..depth).map(|i| Block::load(w, &format!("{p}.blocks.{i}"), dim, num_heads)).collect::<Result<Vec<_>>>()?;
        let norm = LayerNorm::load(w, &format!("{p}.norm"), dim)?;
        let patch_weight_t = patch_weight.reshape((dim, 3 * PATCH_SIZE * PATCH_SIZE))?.t()?.contiguous()?;
        Ok(Self { embed_dim: dim, patch_weight_t, patch_bias, cls_token, pos_embed, blocks, norm })
    }

    pub fn depth(&self) -> usize {
        self.blocks.len()
    }

    /// `prepare_tokens_with_masks`: 14x14/14 patch embedding (as one matrix product over the
    /// unfolded patches), class token, position embedding. `image` is (3, 14h, 14w).
    pub fn prepare_tokens(&self, image: &Tensor, h: usize, w: usize, pos_embed: &Tensor) -> Result<Tensor> {
        let patches = image.reshape((3, h, PATCH_SIZE, w, PATCH_SIZE))?.permute((1, 3, 0, 2, 4))?.reshape((h * w, 3 * PATCH_SIZE * PATCH_SIZE))?;
        let x = super::matmul(&patches, &self.patch_weight_t, self.patch_weight_t.dtype())?.broadcast_add(&self.patch_bias)?;
        let x = Tensor::cat(&[&self.cls_token, &x], 0)?;
        Ok((x + pos_embed)?)
    }

    /// `get_intermediate_layers(norm=True)`: the final-norm'd tokens (cls first) after each
    /// block in `taps`, in order.
    pub fn intermediate_layers(&self, mut x: Tensor, taps: &[usize]) -> Result<Vec<Tensor>> {
        let last = taps.iter().copied().max().unwrap_or(0);
        let mut out = Vec::with_capacity(taps.len());
        for (i, blk) in self.blocks.iter().enumerate().take(last + 1) {
            x = blk.forward(&x)?;
            if taps.contains(&i) {
                out.push(self.norm.forward(&x)?);
            }
        }
        Ok(out)
    }
}
