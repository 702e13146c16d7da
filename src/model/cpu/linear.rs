//! The ViT's linear layers with their epilogues fused: bias (written before the GEMM
//! accumulates), exact-erf GELU after fc1, and LayerScale + residual after attn.proj and fc2.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape};
use rayon::prelude::*;

use super::tensor::{contiguous, with_f32};

use std::sync::Arc;

use crate::simd::isa::Isa;
use crate::simd::sgemm::{self, Panels};
use crate::simd::Mat;

use super::layer_norm::LayerNormOp;
use super::matmul::bf16::{
    linear_bf16, linear_bf16_from_pairs, linear_bf16_pairs, linear_bf16_pairs_from_pairs, linear_bf16_residual, linear_bf16_residual_pairs, PackedB,
};
use super::matmul::gemm::{Gemm, Strided};
use super::matmul::int8::{self, QuantB};

/// What follows the GEMM.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Epilogue {
    Bias,
    BiasGelu,
}

/// The weight of the f32 product.
#[derive(Clone)]
pub enum F32Weight {
    /// PyTorch's (out, in) weight, shared with the model's tensor (no transposed copy), for
    /// the `gemm` crate.
    Tensor(candle_core::Tensor),
    /// Wᵀ in the one-tap kernel's column panels ([`sgemm`]), packed where
    /// [`Panels::available`] held at load; the model keeps no other copy.
    Panels(Arc<Panels>),
    /// None: the op's `packed` weight (bf16 or int8) is its only one.
    InPacked,
}

/// The weight of a bf16 or int8 product, in that product's own form.
#[derive(Clone)]
pub enum Packed {
    /// Wᵀ rounded to bf16 and packed ([`PackedB`]).
    Bf16(Arc<PackedB>),
    /// W quantised per output channel ([`QuantB`]).
    Int8(Arc<QuantB>),
}

/// y (n × out) = x (n × in) · Wᵀ + b, W given as PyTorch's (out, in).
pub struct LinearOp {
    pub weight: F32Weight,
    pub bias: Vec<f32>,
    pub d_in: usize,
    pub d_out: usize,
    pub epilogue: Epilogue,
    /// The weight of the bf16 or int8 products, when the model runs in either.
    pub packed: Option<Packed>,
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
        let y = self.product(contiguous(s, l, "linear")?, n)?;
        Ok((CpuStorage::F32(y), Shape::from((n, self.d_out))))
    }
}

/// `residual + gamma ⊙ linear(x)`: a ViT block's attn.proj or fc2 with its LayerScale and the
/// residual add, applied by the bf16 tiles' epilogue (elsewhere in a pass after the product, as
/// [`ScaledResidualOp`]).
pub struct LinearResidual<'a> {
    pub linear: &'a LinearOp,
    pub gamma: &'a [f32],
}

impl CustomOp2 for LinearResidual<'_> {
    fn name(&self) -> &'static str {
        "linear-layerscale-residual"
    }
    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let op = self.linear;
        let (n, d_in) = l1.shape().dims2()?;
        if d_in != op.d_in || l2.shape().dims() != [n, op.d_out] || self.gamma.len() != op.d_out || op.epilogue != Epilogue::Bias {
            candle_core::bail!(
                "linear-residual: input {:?}, residual {:?}, {} gammas for a {}x{} weight",
                l1.shape(),
                l2.shape(),
                self.gamma.len(),
                op.d_out,
                op.d_in
            );
        }
        let (x, res) = (contiguous(s1, l1, "linear")?, contiguous(s2, l2, "linear residual")?);
        Ok((CpuStorage::F32(op.product_residual(x, n, res, self.gamma)?), l2.shape().clone()))
    }
}

/// `linear(norm(x))`: a ViT block's LayerNorm and the linear after it (qkv) in one op. On the
/// bf16 tiles the norm writes its rows straight in bf16 as the product's A
/// ([`LayerNormOp::run_pairs`]): the bits the product would have rounded them to, without the
/// f32 rows written and read back. Elsewhere the two in turn.
pub struct NormLinear<'a> {
    pub norm: &'a LayerNormOp,
    pub linear: &'a LinearOp,
}

impl CustomOp1 for NormLinear<'_> {
    fn name(&self) -> &'static str {
        "layer-norm-linear"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let op = self.linear;
        let (n, d_in) = l.shape().dims2()?;
        if d_in != op.d_in || self.norm.weight.len() != d_in {
            candle_core::bail!("norm-linear: input {:?}, a norm of {} for a {}x{} weight", l.shape(), self.norm.weight.len(), op.d_out, op.d_in);
        }
        let x = contiguous(s, l, "norm-linear")?;
        Ok((CpuStorage::F32(op.product_normed(self.norm, x, n)?), Shape::from((n, op.d_out))))
    }
}

/// `residual + gamma ⊙ fc2(gelu(fc1(x)))`, x = `norm`(input) where there is a norm (else the
/// input): a ViT block's LayerNorm, MLP, LayerScale and residual add in one op. On the bf16
/// tiles the norm writes its rows in bf16 as fc1's A (as [`NormLinear`]), and fc1's epilogue
/// stores its output in bf16 as fc2's A ([`linear_bf16_pairs`]): the same bits fc2 would have
/// rounded it to, half the bytes written and read back, and no conversion pass inside fc2.
/// Elsewhere the ops in turn.
pub struct MlpResidual<'a> {
    pub norm: Option<&'a LayerNormOp>,
    pub fc1: &'a LinearOp,
    pub fc2: &'a LinearOp,
    pub gamma: &'a [f32],
}

impl CustomOp2 for MlpResidual<'_> {
    fn name(&self) -> &'static str {
        "mlp-layerscale-residual"
    }
    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (fc1, fc2) = (self.fc1, self.fc2);
        let (n, d_in) = l1.shape().dims2()?;
        let shapes = d_in == fc1.d_in && fc1.d_out == fc2.d_in && l2.shape().dims() == [n, fc2.d_out] && self.gamma.len() == fc2.d_out;
        if !shapes || fc1.epilogue != Epilogue::BiasGelu || fc2.epilogue != Epilogue::Bias {
            candle_core::bail!(
                "mlp-residual: input {:?}, residual {:?}, {} gammas for {}x{} then {}x{}",
                l1.shape(),
                l2.shape(),
                self.gamma.len(),
                fc1.d_out,
                fc1.d_in,
                fc2.d_out,
                fc2.d_in
            );
        }
        if self.norm.is_some_and(|m| m.weight.len() != d_in) {
            candle_core::bail!("mlp-residual: a norm of {} for an input {:?}", self.norm.map_or(0, |m| m.weight.len()), l1.shape());
        }
        let (x, res) = (contiguous(s1, l1, "mlp")?, contiguous(s2, l2, "mlp residual")?);
        let threads = rayon::current_num_threads().max(1);
        if let (Some(Packed::Bf16(p1)), Some(Packed::Bf16(p2))) = (&fc1.packed, &fc2.packed) {
            // Only where fc1 gives pairs (else the norm would run here and again below).
            let h = match (self.norm, p1.tile_pairs(n)) {
                (Some(norm), Some((layout, isa))) if p1.gives_pairs(n) => {
                    linear_bf16_pairs_from_pairs(&norm.run_pairs(x, layout, isa), p1, &fc1.bias, Some(fc1.isa), threads)
                }
                (Some(_), _) => None,
                (None, _) => linear_bf16_pairs(Mat::from_slice(x, n, d_in, d_in), p1, &fc1.bias, Some(fc1.isa), threads),
            };
            if let Some(h) = h {
                let y = linear_bf16_residual_pairs(&h, p2, &fc2.bias, self.gamma, Mat::from_slice(res, n, fc2.d_out, fc2.d_out), threads);
                return Ok((CpuStorage::F32(y), l2.shape().clone()));
            }
        }
        let h = match self.norm {
            Some(norm) => fc1.product_normed(norm, x, n)?,
            None => fc1.product(x, n)?,
        };
        Ok((CpuStorage::F32(fc2.product_residual(&h, n, res, self.gamma)?), l2.shape().clone()))
    }
}

impl LinearOp {
    /// x (n × d_in) · Wᵀ + b [then GELU], by the op's route.
    fn product(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let d_in = self.d_in;
        // Every route applies the bias and, for fc1, the GELU itself.
        let gelu = (self.epilogue == Epilogue::BiasGelu).then_some(self.isa);
        Ok(match (&self.packed, &self.weight) {
            (Some(Packed::Int8(q)), _) => match int8::product(x, n, q, &self.bias, gelu) {
                Some(y) => y,
                // The emulated route: the same quantisation, through the f32 product.
                None => {
                    let int8::Store::Dequantised(w) = q.store() else { candle_core::bail!("linear: int8 weights without a route") };
                    let xq = int8::fake_quantised(x, n, d_in);
                    self.bias_then_gelu(product_bt(&xq, w, n, d_in, self.d_out))
                }
            },
            // The bias and GELU as the product's epilogue (applied in the tiles' groups).
            (Some(Packed::Bf16(p)), _) => linear_bf16(Mat::from_slice(x, n, d_in, d_in), p, &self.bias, gelu, rayon::current_num_threads().max(1)),
            // GELU on each tile as the product finishes it.
            (None, F32Weight::Panels(p)) => sgemm::linear(x, n, p, &self.bias, gelu),
            (None, F32Weight::InPacked) => candle_core::bail!("linear: no weight (a bf16 or int8 op without its packed weight)"),
            // The product written over unset memory, then the bias (and GELU) in one pass,
            // instead of zeroing it, filling it with the bias rows and having the product read
            // them back: 1.04x for ViT-L's four linears on an Intel Xeon, alternated in one
            // process.
            (None, F32Weight::Tensor(t)) => self.bias_then_gelu(with_f32(t, |w| product_bt(x, w, n, d_in, self.d_out))?),
        })
    }

    /// [`LinearOp::product`] of `norm`(x): on the bf16 tiles from the norm's rows written as
    /// bf16 pairs, on int8's routes from its rows quantised as they are made (neither stored
    /// as f32), elsewhere the norm then the product.
    fn product_normed(&self, norm: &LayerNormOp, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let d_in = self.d_in;
        let gelu = (self.epilogue == Epilogue::BiasGelu).then_some(self.isa);
        match &self.packed {
            Some(Packed::Bf16(p)) => {
                if let Some((layout, isa)) = p.tile_pairs(n) {
                    let a = norm.run_pairs(x, layout, isa);
                    if let Some(y) = linear_bf16_from_pairs(&a, p, &self.bias, gelu, rayon::current_num_threads().max(1)) {
                        return Ok(y);
                    }
                }
            }
            Some(Packed::Int8(q)) => {
                if let Some(y) = int8::product_of_rows(n, q, &self.bias, gelu, |i, f| norm.with_row(&x[i * d_in..(i + 1) * d_in], f)) {
                    return Ok(y);
                }
            }
            None => {}
        }
        self.product(&norm.run(x), n)
    }

    /// `residual + gamma ⊙ (x · Wᵀ + b)` (x n × d_in, the residual n × d_out): in the bf16
    /// tiles' epilogue, elsewhere in a pass after the product.
    fn product_residual(&self, x: &[f32], n: usize, res: &[f32], gamma: &[f32]) -> Result<Vec<f32>> {
        let (d_in, d_out) = (self.d_in, self.d_out);
        if let Some(Packed::Bf16(p)) = &self.packed {
            let threads = rayon::current_num_threads().max(1);
            return Ok(linear_bf16_residual(Mat::from_slice(x, n, d_in, d_in), p, &self.bias, gamma, Mat::from_slice(res, n, d_out, d_out), threads));
        }
        let mut y = self.product(x, n)?;
        if d_out > 0 {
            y.par_chunks_mut(d_out).zip(res.par_chunks(d_out)).for_each(|(yr, xr)| {
                yr.iter_mut().zip(xr).zip(gamma).for_each(|((y, &x), &g)| *y = x + *y * g);
            });
        }
        Ok(y)
    }

    /// Each row of `y` plus the bias, through GELU after fc1, in one pass.
    fn bias_then_gelu(&self, mut y: Vec<f32>) -> Vec<f32> {
        let d = self.d_out;
        if d == 0 {
            return y;
        }
        // Whole rows per chunk, about 16 KiB of them: the GELU reads what the add left in L1.
        let rows = (4096 / d).max(1);
        y.par_chunks_mut(rows * d).for_each(|c| {
            for r in c.chunks_exact_mut(d) {
                r.iter_mut().zip(&self.bias).for_each(|(v, b)| *v += b);
            }
            if self.epilogue == Epilogue::BiasGelu {
                crate::simd::math::gelu_in_place(self.isa, c);
            }
        });
        y
    }
}

/// y (m × n) = x (m × k) · wᵀ, w given as (n × k) (a linear on PyTorch's (out, in) weight,
/// read in place through strides), by the `gemm` crate on the rayon pool, into a new buffer
/// that is never zeroed (the product does not read it).
fn product_bt(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    assert!(x.len() >= m * k && w.len() >= n * k, "linear: operand sizes");
    let mut y: Vec<f32> = Vec::with_capacity(m * n);
    let threads = rayon::current_num_threads().max(1);
    // SAFETY: with `read_dst` false the product writes all of `y`'s m · n floats (its capacity)
    // and reads none, before `set_len`; x holds m rows of k, w n rows of k (asserted).
    unsafe {
        Gemm::new(m, n, k).on_rayon(threads).run(Strided::rows(y.as_mut_ptr(), n), Strided::rows(x.as_ptr(), k), Strided::cols(w.as_ptr(), k));
        y.set_len(m * n);
    }
    y
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
        // Into an output that is never zeroed (that ran on the calling thread alone).
        let mut out: Vec<f32> = Vec::with_capacity(x.len());
        out.spare_capacity_mut()[..x.len()].par_chunks_mut(d).zip(x.par_chunks(d)).zip(y.par_chunks(d)).for_each(|((o, xr), yr)| {
            for (((o, &x), &y), &g) in o.iter_mut().zip(xr).zip(yr).zip(&self.gamma) {
                o.write(x + y * g);
            }
        });
        // SAFETY: every row (x.len() is a multiple of d, checked above) was written whole.
        unsafe { out.set_len(x.len()) };
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::matmul::bf16::Kernel;
    use crate::simd::{isa, test_values};
    use candle_core::{Device, Tensor};

    /// Both f32 weights (the tensor for the `gemm` crate, the one-tap kernel's panels where
    /// this machine has it) with each epilogue against f64, at every level: 37 rows, widths not
    /// a multiple of 16, an inner dimension past one slice.
    #[test]
    fn linears_match_reference_at_every_level() {
        let mut seed = 0x6a09_e667_f3bc_c908u64;
        let (n, d_in, d_out) = (37, 300, 40);
        let x = test_values(&mut seed, n * d_in);
        let w = test_values(&mut seed, d_out * d_in);
        let bias = test_values(&mut seed, d_out);
        let xt = Tensor::from_vec(x.clone(), (n, d_in), &Device::Cpu).unwrap();
        for level in isa::levels() {
            let mut weights = vec![("tensor", F32Weight::Tensor(Tensor::from_vec(w.clone(), (d_out, d_in), &Device::Cpu).unwrap()))];
            if Panels::available(level) {
                weights.push(("panels", F32Weight::Panels(Arc::new(Panels::new(&w, d_in, d_out, 1, d_in)))));
            }
            for (label, weight) in weights {
                for epilogue in [Epilogue::Bias, Epilogue::BiasGelu] {
                    let op = LinearOp { weight: weight.clone(), bias: bias.clone(), d_in, d_out, epilogue, packed: None, isa: level };
                    let y: Vec<f32> = isa::with_isa(level, || xt.apply_op1_no_bwd(&op)).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                    for i in 0..n {
                        for o in 0..d_out {
                            let terms = (0..d_in).map(|c| x[i * d_in + c] as f64 * w[o * d_in + c] as f64);
                            let mag = terms.clone().map(f64::abs).sum::<f64>() + (bias[o] as f64).abs();
                            let v = terms.sum::<f64>() + bias[o] as f64;
                            let want = if epilogue == Epilogue::Bias { v } else { 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2)) };
                            let got = y[i * d_out + o] as f64;
                            assert!((got - want).abs() <= 1e-5 * mag + 1e-6, "{level} {label} {epilogue:?} [{i},{o}]: {got} vs {want}");
                        }
                    }
                }
            }
        }
    }

    /// `residual + gamma ⊙ linear(x)` in one op against f64, with both f32 weights at every
    /// level and bf16 (the tiles' epilogue where this machine has AMX, the pass after the
    /// product elsewhere).
    #[test]
    fn linear_residual_matches_reference() {
        let mut seed = 0x510e_527f_ade6_82d1u64;
        let (n, d_in, d_out) = (37, 300, 40);
        let x = test_values(&mut seed, n * d_in);
        let w = test_values(&mut seed, d_out * d_in);
        let bias = test_values(&mut seed, d_out);
        let gamma = test_values(&mut seed, d_out);
        let res = test_values(&mut seed, n * d_out);
        let xt = Tensor::from_vec(x.clone(), (n, d_in), &Device::Cpu).unwrap();
        let rt = Tensor::from_vec(res.clone(), (n, d_out), &Device::Cpu).unwrap();
        for level in isa::levels() {
            let mut ops = vec![("tensor", F32Weight::Tensor(Tensor::from_vec(w.clone(), (d_out, d_in), &Device::Cpu).unwrap()), None)];
            if Panels::available(level) {
                ops.push(("panels", F32Weight::Panels(Arc::new(Panels::new(&w, d_in, d_out, 1, d_in))), None));
            }
            let bf16 = isa::with_isa(level, || PackedB::from_f32_nk(&w, d_out, d_in));
            ops.push(("bf16", F32Weight::InPacked, Some(Packed::Bf16(Arc::new(bf16)))));
            for (label, weight, packed) in ops {
                let bf16 = packed.is_some();
                let op = LinearOp { weight, bias: bias.clone(), d_in, d_out, epilogue: Epilogue::Bias, packed, isa: level };
                let fused = LinearResidual { linear: &op, gamma: &gamma };
                let y: Vec<f32> = isa::with_isa(level, || xt.apply_op2_no_bwd(&rt, &fused)).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                let r = |v: f32| if bf16 { crate::model::cpu::matmul::bf16::round_bf16(v) } else { v } as f64;
                for i in 0..n {
                    for o in 0..d_out {
                        let terms = (0..d_in).map(|c| r(x[i * d_in + c]) * r(w[o * d_in + c]));
                        let mag =
                            (terms.clone().map(f64::abs).sum::<f64>() + (bias[o] as f64).abs()) * (gamma[o] as f64).abs() + (res[i * d_out + o] as f64).abs();
                        let want = res[i * d_out + o] as f64 + gamma[o] as f64 * (terms.sum::<f64>() + bias[o] as f64);
                        let got = y[i * d_out + o] as f64;
                        assert!((got - want).abs() <= 1e-5 * mag + 1e-6, "{level} {label} [{i},{o}]: {got} vs {want}");
                    }
                }
            }
        }
    }

    /// The MLP in one op (`MlpResidual`), with and without its LayerNorm, gives the bits of the
    /// norm, fc1 with its GELU then `LinearResidual`; and `NormLinear` those of the norm then
    /// the linear: at every level, f32, bf16 (on the tiles: the norm's and fc1's outputs as
    /// bf16 pairs) and int8 (the norm's rows quantised as they are made). d = 48 pads the
    /// norm's rows to whole tiles of pairs.
    #[test]
    fn mlp_residual_is_fc1_then_the_residual_linear() {
        let mut seed = 0x9b05_688c_2b3e_6c1fu64;
        // h = 96 gives fc1's pairs; h = 40 does not (the MLP then runs fc1 from the norm's
        // pairs to f32).
        for (n, d, h) in [(37usize, 48usize, 96usize), (37, 48, 40)] {
            let x = test_values(&mut seed, n * d);
            let (w1, w2) = (test_values(&mut seed, h * d), test_values(&mut seed, d * h));
            let (b1, b2, gamma) = (test_values(&mut seed, h), test_values(&mut seed, d), test_values(&mut seed, d));
            let res = test_values(&mut seed, n * d);
            let (lw, lb) = (test_values(&mut seed, d), test_values(&mut seed, d));
            let xt = Tensor::from_vec(x, (n, d), &Device::Cpu).unwrap();
            let rt = Tensor::from_vec(res, (n, d), &Device::Cpu).unwrap();
            let bits = |t: candle_core::Result<Tensor>| -> Vec<u32> {
                t.unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
            };
            for level in isa::levels() {
                let ln = LayerNormOp { weight: lw.clone(), bias: lb.clone(), eps: 1e-6, isa: level };
                let normed = isa::with_isa(level, || xt.apply_op1_no_bwd(&ln)).unwrap();
                // f32; bf16 and int8 by the level's kernels, and on the emulated tiles (every
                // machine runs the pairs' path and the int8 tiles').
                for (kind, emulated) in [("f32", false), ("bf16", false), ("bf16", true), ("int8", false), ("int8", true)] {
                    let op = |w: &[f32], b: &[f32], d_in: usize, d_out: usize, epilogue| {
                        let packed = match (kind, emulated) {
                            ("bf16", true) => Some(Packed::Bf16(Arc::new(PackedB::build_for(w, d_in, d_out, true, Some(Kernel::Tiles { emulated: true }))))),
                            ("bf16", false) => Some(Packed::Bf16(Arc::new(isa::with_isa(level, || PackedB::from_f32_nk(w, d_out, d_in))))),
                            ("int8", true) => Some(Packed::Int8(Arc::new(QuantB::for_route(w, d_out, d_in, int8::Route::AmxEmulated)))),
                            ("int8", false) => Some(Packed::Int8(Arc::new(QuantB::from_f32_nk(w, d_out, d_in, level)))),
                            _ => None,
                        };
                        let weight = match packed {
                            Some(_) => F32Weight::InPacked,
                            None => F32Weight::Tensor(Tensor::from_vec(w.to_vec(), (d_out, d_in), &Device::Cpu).unwrap()),
                        };
                        LinearOp { weight, bias: b.to_vec(), d_in, d_out, epilogue, packed, isa: level }
                    };
                    let (fc1, fc2) = (op(&w1, &b1, d, h, Epilogue::BiasGelu), op(&w2, &b2, h, d, Epilogue::Bias));
                    for norm in [None, Some(&ln)] {
                        let fused = MlpResidual { norm, fc1: &fc1, fc2: &fc2, gamma: &gamma };
                        let got = bits(isa::with_isa(level, || xt.apply_op2_no_bwd(&rt, &fused)));
                        let input = if norm.is_some() { &normed } else { &xt };
                        let want =
                            bits(isa::with_isa(level, || input.apply_op1_no_bwd(&fc1)?.apply_op2_no_bwd(&rt, &LinearResidual { linear: &fc2, gamma: &gamma })));
                        assert_eq!(got, want, "{level} {kind} emulated={emulated} norm={}", norm.is_some());
                    }
                    for linear in [&fc1, &op(&w1, &b1, d, h, Epilogue::Bias)] {
                        let got = bits(isa::with_isa(level, || xt.apply_op1_no_bwd(&NormLinear { norm: &ln, linear })));
                        let want = bits(isa::with_isa(level, || normed.apply_op1_no_bwd(linear)));
                        assert_eq!(got, want, "norm-linear {level} {kind} emulated={emulated} {:?}", linear.epilogue);
                    }
                }
            }
        }
    }
}
