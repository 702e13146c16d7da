//! The ViT's LayerNorm over each token's channels (`nn.LayerNorm`, DINOv2's eps 1e-6): rows in
//! parallel, each by the level's vector code (`crate::simd::math::layer_norm_row`), into an
//! output that is never zeroed. candle's summed each row in one scalar chain on a zeroed
//! output (48 of them per ViT-L forward).

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape};
use rayon::prelude::*;

use super::matmul::bf16::{convert_rows_uninit, Pairs, PairsLayout};
use super::tensor::contiguous;
use crate::simd::isa::Isa;
use crate::simd::math::layer_norm_row;
use crate::simd::{Lines, Mat, SendPtr};

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

impl LayerNormOp {
    /// `f` on one row of x normalised, in a buffer of this thread's kept between calls (in L1
    /// while `f` reads it): for the ops that take the norm's rows one at a time and never store
    /// them as f32 ([`LayerNormOp::run_pairs`], int8's quantised rows).
    pub(crate) fn with_row<R>(&self, x: &[f32], f: impl FnOnce(&[f32]) -> R) -> R {
        crate::simd::with_local(&ROW, |row| {
            row.resize(x.len(), std::mem::MaybeUninit::uninit());
            layer_norm_row(self.isa, x, &self.weight, &self.bias, self.eps, row);
            // SAFETY: `layer_norm_row` wrote all of the row's floats.
            f(unsafe { &*(row.as_slice() as *const [std::mem::MaybeUninit<f32>] as *const [f32]) })
        })
    }

    /// [`LayerNormOp::run`] written straight as the next product's A in bf16 (each row's bits
    /// those the product's conversion of the f32 row gives, `bf16::convert_rows` by `isa`), laid
    /// out as `layout` says (`PackedB::tile_pairs`). The f32 output of a ViT block's norm was
    /// written to be read back and converted by the next linear.
    pub(crate) fn run_pairs(&self, x: &[f32], layout: PairsLayout, isa: Isa) -> Pairs {
        let d = self.weight.len();
        let n = x.len().checked_div(d).unwrap_or(0);
        let PairsLayout { kps, stride, rows } = layout;
        assert!(rows >= n && 2 * kps >= d && stride >= kps, "layer norm: {layout:?} for {n} rows of {d}");
        let mut out = Lines::<u32>::zeros(0);
        // SAFETY: every word is written: each row's kps by its task (`convert_rows_uninit`
        // writes them all, zeros past d) and the rest of its stride, then the rows past n.
        unsafe {
            out.fill_uninit(rows * stride, |p| {
                let p = SendPtr(p as *mut f32);
                if n > 0 {
                    let chunk = (4096 / d).max(1);
                    x.par_chunks(chunk * d).enumerate().for_each(|(c, x)| {
                        for (i, x) in x.chunks_exact(d).enumerate() {
                            self.with_row(x, |row| {
                                let dst = (p.get() as *mut u32).add((c * chunk + i) * stride);
                                convert_rows_uninit(
                                    isa,
                                    Mat::from_slice(row, 1, d, d),
                                    kps,
                                    std::slice::from_raw_parts_mut(dst as *mut std::mem::MaybeUninit<u32>, kps),
                                );
                                std::ptr::write_bytes(dst.add(kps), 0, stride - kps);
                            })
                        }
                    });
                }
                std::ptr::write_bytes((p.get() as *mut u32).add(n * stride), 0, (rows - n) * stride);
            });
        }
        Pairs { words: out, m: n, layout }
    }
}

thread_local! {
    /// [`LayerNormOp::with_row`]'s row, kept between calls.
    static ROW: std::cell::RefCell<Vec<std::mem::MaybeUninit<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
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
