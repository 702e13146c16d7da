//! The ViT's linear layers with their epilogues fused: bias (written before the GEMM
//! accumulates), exact-erf GELU after fc1, and LayerScale + residual after attn.proj and fc2.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape};
use rayon::prelude::*;

use super::contiguous;

use std::sync::Arc;

use super::bf16::{gemm_bf16, PackedB};
use super::isa::Isa;
use super::planes::gemm_into_bt;

/// What follows the GEMM.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Epilogue {
    Bias,
    BiasGelu,
}

/// y (n × out) = x (n × in) · Wᵀ + b, W given as PyTorch's (out, in).
pub struct LinearOp {
    /// PyTorch's (out, in) weight, shared with the model's tensor (no transposed copy).
    pub weight: candle_core::Tensor,
    pub bias: Vec<f32>,
    pub d_in: usize,
    pub d_out: usize,
    pub epilogue: Epilogue,
    /// Wᵀ pre-packed for bf16 products, when the model runs in bf16.
    pub packed: Option<Arc<PackedB>>,
    /// The level of the epilogue's GELU (`isa::current()` when the model was built).
    pub isa: Isa,
}

impl CustomOp1 for LinearOp {
    fn name(&self) -> &'static str {
        "linear"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, d_in) = l.shape().dims2()?;
        if d_in != self.d_in {
            candle_core::bail!("linear: input width {d_in}, weight expects {}", self.d_in);
        }
        let x = contiguous(s, l, "linear")?;
        let mut y = vec![0f32; n * self.d_out];
        y.par_chunks_mut(self.d_out).for_each(|r| r.copy_from_slice(&self.bias));
        match &self.packed {
            Some(p) => gemm_bf16(x, n, d_in, d_in, p, &mut y, self.d_out, true, rayon::current_num_threads().max(1)),
            None => super::with_f32(&self.weight, |w| gemm_into_bt(&mut y, x, w, n, d_in, self.d_out))?,
        }
        if self.epilogue == Epilogue::BiasGelu {
            y.par_chunks_mut(4096).for_each(|c| super::math::gelu_in_place(self.isa, c));
        }
        Ok((CpuStorage::F32(y), Shape::from((n, self.d_out))))
    }
}

/// `x + gamma ⊙ y` (LayerScale then the residual add), rows of width `gamma.len()`.
pub struct ScaledResidualOp {
    pub gamma: Vec<f32>,
}

impl CustomOp2 for ScaledResidualOp {
    fn name(&self) -> &'static str {
        "layerscale-residual"
    }
    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = contiguous(s1, l1, "layerscale")?;
        let y = contiguous(s2, l2, "layerscale")?;
        let d = self.gamma.len();
        if l1.shape() != l2.shape() || x.len() % d != 0 {
            candle_core::bail!("layerscale: shapes {:?} / {:?} vs width {d}", l1.shape(), l2.shape());
        }
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(d).zip(x.par_chunks(d)).zip(y.par_chunks(d)).for_each(|((o, xr), yr)| {
            for i in 0..d {
                o[i] = xr[i] + yr[i] * self.gamma[i];
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

