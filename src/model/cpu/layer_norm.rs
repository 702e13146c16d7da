//! The ViT's LayerNorm over each token's channels (`nn.LayerNorm`, DINOv2's eps 1e-6): rows in
//! parallel, each by the level's vector code (`crate::simd::math::layer_norm_row`), into an
//! output that is never zeroed. candle's summed each row in one scalar chain on a zeroed
//! output (48 of them per ViT-L forward).

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape};
use rayon::prelude::*;

use super::tensor::contiguous;
use crate::simd::isa::Isa;
use crate::simd::math::layer_norm_row;

pub struct LayerNormOp {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
    pub eps: f32,
    /// The level of the row code (`isa::current()` when the model was built).
    pub isa: Isa,
}

impl LayerNormOp {
    /// The rows of `x` (each `weight.len()` wide) normalised.
    pub fn run(&self, x: &[f32]) -> Vec<f32> {
        let d = self.weight.len();
        let mut out: Vec<f32> = Vec::with_capacity(x.len());
        if d == 0 || x.is_empty() {
            return out;
        }
        // Rows in tasks of ~16 KiB.
        let rows = (4096 / d).max(1);
        out.spare_capacity_mut()[..x.len()].par_chunks_mut(rows * d).zip(x.par_chunks(rows * d)).for_each(|(o, x)| {
            for (o, x) in o.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
                layer_norm_row(self.isa, x, &self.weight, &self.bias, self.eps, o);
            }
        });
        // SAFETY: `layer_norm_row` wrote every element of every row (x.len() is a multiple of
        // d, checked by the op), so all x.len() floats of the capacity.
        unsafe { out.set_len(x.len()) };
        out
    }
}

impl CustomOp1 for LayerNormOp {
    fn name(&self) -> &'static str {
        "layer-norm-rows"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = contiguous(s, l, "layer norm")?;
        let d = self.weight.len();
        if l.shape().dims().last() != Some(&d) || self.bias.len() != d {
            candle_core::bail!("layer norm: input {:?} for width {d}", l.shape());
        }
        Ok((CpuStorage::F32(self.run(x)), l.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::isa;

    /// Against the definition in f64 at every level, rows of widths that are and are not
    /// multiples of 16, values with a large common offset (where E[x²] − E[x]² in f32 loses
    /// the variance); every level's bits equal the baseline's.
    #[test]
    fn layer_norm_matches_the_definition_at_every_level() {
        let mut seed = 0x6a09_e667_f3bc_c909u64;
        for &(rows, d) in &[(3usize, 1024usize), (5, 37), (1, 1)] {
            let x: Vec<f32> = crate::simd::test_values(&mut seed, rows * d).iter().map(|v| 300.0 + 2.0 * v).collect();
            let w = crate::simd::test_values(&mut seed, d);
            let b = crate::simd::test_values(&mut seed, d);
            let mut first: Option<Vec<f32>> = None;
            for level in isa::levels() {
                let got = LayerNormOp { weight: w.clone(), bias: b.clone(), eps: 1e-6, isa: level }.run(&x);
                for r in 0..rows {
                    let row: Vec<f64> = x[r * d..][..d].iter().map(|&v| v as f64).collect();
                    let mean = row.iter().sum::<f64>() / d as f64;
                    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
                    for c in 0..d {
                        let want = (row[c] - mean) / (var + 1e-6).sqrt() * w[c] as f64 + b[c] as f64;
                        let g = got[r * d + c] as f64;
                        assert!((g - want).abs() <= 2e-3 * (1.0 + want.abs()), "{level} {rows}x{d} [{r},{c}]: {g} vs {want}");
                    }
                }
                match &first {
                    Some(f) => assert_eq!(f, &got, "{level}: not the baseline's bits"),
                    None => first = Some(got),
                }
            }
        }
    }
}
