//! DINOv2 ViT (`moge/model/dinov2/models/vision_transformer.py` and `layers/`), inference path
//! only: no registers, no block chunking, LayerScale on, exact-erf GELU, LayerNorm eps 1e-6.
//! Tokens are kept as a (N, D) matrix: the batch is one image.

use anyhow::Result;
use candle_core::{DType, Module, Tensor};

use std::sync::Arc;

use super::config::{BackboneSpec, Ffn};
use super::cpu::attention::AttentionOp;
use super::cpu::layer_norm::LayerNormOp;
use super::cpu::linear::{Epilogue, F32Weight, LinearOp, LinearResidual, MlpResidual, NormLinear, Packed, ScaledResidualOp};
use super::cpu::matmul::bf16::PackedB;
use super::cpu::matmul::int8::QuantB;
use super::weights::Weights;
use super::{Ops, Precision};
use crate::simd::sgemm::Panels;

/// The linears of a block that `--precision int8` runs as int8 products (`Linear::load_block`),
/// by their names in the state dict under `blocks.N.`.
pub const INT8_LINEARS: [&str; 6] = ["attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2", "mlp.w12", "mlp.w3"];

pub const PATCH_SIZE: usize = 14;
/// Position embeddings are trained for a 37x37 grid (518 / 14).
pub const POS_GRID: usize = 37;
const LN_EPS: f64 = 1e-6;

pub struct Linear {
    /// The dtype of the products' weights.
    dtype: DType,
    route: LinearRoute,
}

/// The ops a [`Linear`] runs, chosen at load ([`super::BuildOptions`]).
enum LinearRoute {
    /// candle's (any device). The weight is PyTorch's (out, in); products read it transposed
    /// through strides.
    Generic { weight: Tensor, bias: Tensor },
    /// The CPU kernel without and with the GELU epilogue. The model's tensor of the weight is
    /// released where the kernel holds it packed (`F32Weight::Panels`, bf16 or int8): one copy
    /// of the weights in memory.
    Cpu(Box<[LinearOp; 2]>),
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
        let dtype = weight.dtype();
        let Some(level) = w.build().cpu_level() else {
            return Ok(Self { dtype, route: LinearRoute::Generic { weight, bias } });
        };
        let precision = w.build().precision();
        let b: Vec<f32> = bias.to_vec1()?;
        let packed = if precision == Precision::Bf16 {
            Some(Packed::Bf16(Arc::new(super::cpu::with_f32(&weight, |wv| PackedB::from_f32_nk(wv, d_out, d_in))?)))
        } else if int8 && precision == Precision::Int8 {
            Some(Packed::Int8(Arc::new(super::cpu::with_f32(&weight, |wv| QuantB::from_f32_nk(wv, d_out, d_in, level))?)))
        } else {
            None
        };
        // The packed weight (bf16 or int8) is the op's only one: no f32 copy beside it.
        let f32_weight = if packed.is_some() {
            F32Weight::InPacked
        } else if Panels::available(level) {
            F32Weight::Panels(Arc::new(super::cpu::with_f32(&weight, |wv| Panels::new(wv, d_in, d_out, 1, d_in))?))
        } else {
            F32Weight::Tensor(weight.clone())
        };
        // Held in another form by the kernel alone: f32 panels, bf16 or int8.
        if matches!(f32_weight, F32Weight::Panels(_) | F32Weight::InPacked) {
            w.release(&format!("{prefix}.weight"));
        }
        let op = |epilogue| LinearOp { weight: f32_weight.clone(), bias: b.clone(), d_in, d_out, epilogue, packed: packed.clone(), isa: level };
        Ok(Self { dtype, route: LinearRoute::Cpu(Box::new([op(Epilogue::Bias), op(Epilogue::BiasGelu)])) })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.route {
            LinearRoute::Cpu(ops) => Ok(x.contiguous()?.apply_op1_no_bwd(&ops[0])?),
            LinearRoute::Generic { weight, bias } => Ok(super::matmul(x, &weight.t()?, self.dtype)?.broadcast_add(bias)?),
        }
    }
    /// GELU(linear(x)), exact erf.
    pub fn forward_gelu(&self, x: &Tensor) -> Result<Tensor> {
        match &self.route {
            LinearRoute::Cpu(ops) => Ok(x.contiguous()?.apply_op1_no_bwd(&ops[1])?),
            LinearRoute::Generic { .. } => Ok(self.forward(x)?.gelu_erf()?),
        }
    }
}

/// LayerScale and the residual add: x + gamma ⊙ y, with the route chosen at load.
enum LayerScale {
    Generic(Tensor),
    Cpu(ScaledResidualOp),
}

impl LayerScale {
    fn load(w: &mut Weights, key: &str, dim: usize) -> Result<Self> {
        let g = w.get(key, &[dim])?;
        Ok(match w.build().ops() {
            Ops::Cpu(_) => LayerScale::Cpu(ScaledResidualOp { gamma: g.to_vec1()? }),
            Ops::Generic => LayerScale::Generic(g),
        })
    }
    fn residual(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        match self {
            LayerScale::Cpu(op) => Ok(x.contiguous()?.apply_op2_no_bwd(&y.contiguous()?, op)?),
            LayerScale::Generic(gamma) => Ok((x + y.broadcast_mul(gamma)?)?),
        }
    }
    /// `x + gamma ⊙ linear(input)`: on the CPU kernels in one op, the bf16 tiles applying the
    /// LayerScale and the add as each group of the product leaves them.
    fn linear_residual(&self, linear: &Linear, input: &Tensor, x: &Tensor) -> Result<Tensor> {
        match (self, &linear.route) {
            (LayerScale::Cpu(op), LinearRoute::Cpu(ops)) => {
                Ok(input.contiguous()?.apply_op2_no_bwd(&x.contiguous()?, &LinearResidual { linear: &ops[0], gamma: &op.gamma })?)
            }
            _ => self.residual(x, &linear.forward(input)?),
        }
    }
    /// `x + gamma ⊙ fc2(gelu(fc1(norm(x))))`: on the CPU kernels in one op ([`MlpResidual`]: on
    /// the bf16 tiles, the norm's and fc1's outputs in bf16 as the next product's operand).
    fn mlp_residual(&self, norm: &LayerNorm, fc1: &Linear, fc2: &Linear, x: &Tensor) -> Result<Tensor> {
        match (self, norm, &fc1.route, &fc2.route) {
            (LayerScale::Cpu(op), LayerNorm::Cpu(ln), LinearRoute::Cpu(o1), LinearRoute::Cpu(o2)) => {
                let x = x.contiguous()?;
                Ok(x.apply_op2_no_bwd(&x, &MlpResidual { norm: Some(ln), fc1: &o1[1], fc2: &o2[0], gamma: &op.gamma })?)
            }
            _ => self.linear_residual(fc2, &fc1.forward_gelu(&norm.forward(x)?)?, x),
        }
    }
}

/// The route chosen at load: candle's LayerNorm, or the CPU kernel.
pub enum LayerNorm {
    Generic(candle_nn::LayerNorm),
    Cpu(LayerNormOp),
}

impl LayerNorm {
    pub fn load(w: &mut Weights, prefix: &str, dim: usize) -> Result<Self> {
        let weight = w.get(&format!("{prefix}.weight"), &[dim])?;
        let bias = w.get(&format!("{prefix}.bias"), &[dim])?;
        Ok(match w.build().ops() {
            Ops::Cpu(isa) => LayerNorm::Cpu(LayerNormOp { weight: weight.to_vec1()?, bias: bias.to_vec1()?, eps: LN_EPS as f32, isa }),
            Ops::Generic => LayerNorm::Generic(candle_nn::LayerNorm::new(weight, bias, LN_EPS)),
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            LayerNorm::Cpu(op) => Ok(x.contiguous()?.apply_op1_no_bwd(op)?),
            LayerNorm::Generic(ln) => Ok(ln.forward(x)?),
        }
    }
}

/// `layers/attention.py`: fused qkv projection, softmax(q kᵀ / √64) v per head, output projection.
pub struct Attention {
    qkv: Linear,
    proj: Linear,
    num_heads: usize,
    /// The fused CPU kernel (its level and products chosen at load), or candle's ops.
    cpu: Option<AttentionOp>,
}

impl Attention {
    /// `x + ls ⊙ attention(norm(x))`: the norm and qkv in one op on the CPU kernels
    /// ([`NormLinear`]), the heads, then the output projection with the LayerScale and the add
    /// in one op ([`LayerScale::linear_residual`]).
    fn forward_residual(&self, norm: &LayerNorm, x: &Tensor, ls: &LayerScale) -> Result<Tensor> {
        let heads = match (&self.cpu, norm, &self.qkv.route) {
            (Some(op), LayerNorm::Cpu(ln), LinearRoute::Cpu(ops)) => {
                let qkv = x.contiguous()?.apply_op1_no_bwd(&NormLinear { norm: ln, linear: &ops[0] })?;
                qkv.apply_op1_no_bwd(op)?
            }
            _ => self.heads(&norm.forward(x)?)?,
        };
        ls.linear_residual(&self.proj, &heads, x)
    }

    /// softmax(q kᵀ / √d) v of every head, (n, d), before the output projection.
    fn heads(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(op) = &self.cpu {
            let qkv = self.qkv.forward(x)?.contiguous()?;
            return Ok(qkv.apply_op1_no_bwd(op)?);
        }
        let (n, d) = x.dims2()?;
        let hd = d / self.num_heads;
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
        Ok(out.permute((1, 0, 2))?.reshape((n, d))?)
    }
}

/// A block's feed-forward layer (`layers/mlp.py`, `layers/swiglu_ffn.py`).
enum Mlp {
    /// fc1, GELU, fc2.
    Gelu { fc1: Linear, fc2: Linear },
    /// w12 (both halves in one product), SiLU(x1) · x2, w3.
    SwiGlu { w12: Linear, w3: Linear, hidden: usize },
}

impl Mlp {
    fn load(w: &mut Weights, p: &str, dim: usize, ffn: Ffn) -> Result<Self> {
        let hidden = ffn.hidden(dim);
        Ok(match ffn {
            Ffn::Mlp => Mlp::Gelu {
                fc1: Linear::load_block(w, &format!("{p}.{}", INT8_LINEARS[2]), dim, hidden)?,
                fc2: Linear::load_block(w, &format!("{p}.{}", INT8_LINEARS[3]), hidden, dim)?,
            },
            Ffn::SwiGlu => Mlp::SwiGlu {
                w12: Linear::load_block(w, &format!("{p}.{}", INT8_LINEARS[4]), dim, 2 * hidden)?,
                w3: Linear::load_block(w, &format!("{p}.{}", INT8_LINEARS[5]), hidden, dim)?,
                hidden,
            },
        })
    }

    /// `x + ls ⊙ mlp(norm(x))`: the last linear (fc2, w3) with the LayerScale and the add in
    /// one op on the CPU kernels ([`LayerScale::linear_residual`]; the GELU MLP whole, with the
    /// norm, [`LayerScale::mlp_residual`]).
    fn forward_residual(&self, norm: &LayerNorm, x: &Tensor, ls: &LayerScale) -> Result<Tensor> {
        match self {
            Mlp::Gelu { fc1, fc2 } => ls.mlp_residual(norm, fc1, fc2, x),
            Mlp::SwiGlu { w12, w3, hidden } => {
                let x12 = w12.forward(&norm.forward(x)?)?;
                let h = (x12.narrow(1, 0, *hidden)?.silu()? * x12.narrow(1, *hidden, *hidden)?)?;
                ls.linear_residual(w3, &h, x)
            }
        }
    }
}

/// `layers/block.py` eval path: x + ls1·attn(norm1 x), then x + ls2·mlp(norm2 x).
pub struct Block {
    norm1: LayerNorm,
    attn: Attention,
    ls1: LayerScale,
    norm2: LayerNorm,
    mlp: Mlp,
    ls2: LayerScale,
}

impl Block {
    fn load(w: &mut Weights, p: &str, dim: usize, num_heads: usize, ffn: Ffn) -> Result<Self> {
        Ok(Self {
            norm1: LayerNorm::load(w, &format!("{p}.norm1"), dim)?,
            attn: Attention {
                qkv: Linear::load_block(w, &format!("{p}.{}", INT8_LINEARS[0]), dim, 3 * dim)?,
                proj: Linear::load_block(w, &format!("{p}.{}", INT8_LINEARS[1]), dim, dim)?,
                num_heads,
                // bf16 attention also under int8 on AMX, where its tiles run it ~3x faster than the
                // f32 kernels (int8 scores did not pay: docs/precision-and-speed.md).
                cpu: w.build().cpu_level().map(|isa| {
                    let bf16 = match w.build().precision() {
                        Precision::Bf16 => true,
                        Precision::Int8 => isa == crate::simd::isa::Isa::Amx,
                        Precision::F32 => false,
                    };
                    AttentionOp { num_heads, bf16, isa }
                }),
            },
            ls1: LayerScale::load(w, &format!("{p}.ls1.gamma"), dim)?,
            norm2: LayerNorm::load(w, &format!("{p}.norm2"), dim)?,
            mlp: Mlp::load(w, p, dim, ffn)?,
            ls2: LayerScale::load(w, &format!("{p}.ls2.gamma"), dim)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = self.attn.forward_residual(&self.norm1, x, &self.ls1)?;
        self.mlp.forward_residual(&self.norm2, &x, &self.ls2)
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
    pub fn load(w: &mut Weights, p: &str, spec: &BackboneSpec) -> Result<Self> {
        let BackboneSpec { embed_dim: dim, depth, num_heads, ffn } = *spec;
        let patch_weight = w.get_product(&format!("{p}.patch_embed.proj.weight"), &[dim, 3, PATCH_SIZE, PATCH_SIZE])?;
        let patch_bias = w.get(&format!("{p}.patch_embed.proj.bias"), &[dim])?;
        let cls_token = w.get(&format!("{p}.cls_token"), &[1, 1, dim])?.reshape((1, dim))?;
        let pos_embed = w.get(&format!("{p}.pos_embed"), &[1, 1 + POS_GRID * POS_GRID, dim])?.reshape((1 + POS_GRID * POS_GRID, dim))?;
        // Only used for masked pre-training; bound so that the key check stays strict.
        let _mask_token = w.get(&format!("{p}.mask_token"), &[1, dim])?;
        let blocks = (0..depth).map(|i| Block::load(w, &format!("{p}.blocks.{i}"), dim, num_heads, ffn)).collect::<Result<Vec<_>>>()?;
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
