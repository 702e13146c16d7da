//! Multi-head self-attention softmax(q kᵀ/√d) v straight from the fused qkv projection
//! (N, 3·D), never materialising the (heads, N, N) score tensor: each task takes one head and
//! a block of query rows, so its scores (block × N) stay in cache, and softmax runs in place
//! with an exp that the compiler vectorises (libm's is scalar and dominated the encoder).

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape};
use rayon::prelude::*;

use super::SendPtr;

use super::bf16::{gemm_bf16, PackedB};

pub struct AttentionOp {
    pub num_heads: usize,
    /// Both products in bf16 (f32 accumulation).
    pub bf16: bool,
}

/// Query rows per task: 64 × 1800 scores = 450 KiB, L2-resident.
const Q_BLOCK: usize = 64;

/// e^x for x ≤ 0 (softmax after max subtraction): 2^n · p(r) with r = x − n·ln2, |r| ≤ ln2/2,
/// and a degree-6 polynomial (relative error < 2e-7). Written branch-free with float→int by the
/// 1.5·2²³ trick so that LLVM vectorises it.
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const MAGIC: f32 = 12_582_912.0; // 1.5·2²³
    // Plain multiply-adds: `mul_add` without a compile-time FMA target is a libm call.
    let x = x.max(-87.0);
    let t = x * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = r * (1.0 / 720.0) + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    // 2^n from the integer in t's low mantissa bits.
    let bits = (t.to_bits().wrapping_sub(MAGIC.to_bits()) as i32 + 127) << 23;
    p * f32::from_bits(bits as u32)
}

/// In-place softmax of one row.
fn softmax_row(row: &mut [f32]) {
    // 16 independent lanes so the reductions vectorise.
    let mut m = [f32::NEG_INFINITY; 16];
    let mut chunks = row.chunks_exact(16);
    for c in &mut chunks {
        for i in 0..16 {
            m[i] = m[i].max(c[i]);
        }
    }
    let max = chunks.remainder().iter().copied().fold(m.iter().copied().fold(f32::NEG_INFINITY, f32::max), f32::max);
    let mut s = [0f32; 16];
    let mut chunks = row.chunks_exact_mut(16);
    for c in &mut chunks {
        for i in 0..16 {
            c[i] = exp_neg(c[i] - max);
            s[i] += c[i];
        }
    }
    let mut sum: f32 = s.iter().sum();
    for v in chunks.into_remainder() {
        *v = exp_neg(*v - max);
        sum += *v;
    }
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|v| *v *= inv);
}

impl AttentionOp {
    pub fn run(&self, qkv: &[f32], n: usize, d: usize) -> Vec<f32> {
        let heads = self.num_heads;
        let hd = d / heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let row = 3 * d; // qkv row stride
        // bf16: per head, kᵀ and v packed once for all query blocks.
        let packed: Vec<Option<(PackedB, PackedB)>> = (0..heads)
            .into_par_iter()
            .map(|h| {
                self.bf16.then(|| {
                    let gather = |off: usize| -> Vec<f32> { (0..n).flat_map(|i| qkv[i * row + off..i * row + off + hd].iter().copied()).collect() };
                    let k = gather(d + h * hd);
                    let v = gather(2 * d + h * hd);
                    (PackedB::from_f32_nk(&k, n, hd), PackedB::from_f32_kn(&v, n, hd))
                })
            })
            .collect();
        let mut out = vec![0f32; n * d];
        let out_ptr = SendPtr(out.as_mut_ptr());
        let blocks: Vec<(usize, usize)> = (0..heads).flat_map(|h| (0..n).step_by(Q_BLOCK).map(move |q0| (h, q0))).collect();
        blocks.par_iter().for_each_init(|| (Vec::new(), Vec::new()), |(scores, tmp): &mut (Vec<f32>, Vec<f32>), &(h, q0)| {
            let bq = Q_BLOCK.min(n - q0);
            scores.resize(bq * n, 0.0);
            let q = &qkv[q0 * row + h * hd..];
            // Heads write disjoint column ranges and blocks disjoint rows of `out`.
            let dst = unsafe { out_ptr.get().add(q0 * d + h * hd) };
            if let Some((kt, v)) = &packed[h] {
                gemm_bf16(q, bq, hd, row, kt, scores, n, false, 1);
                scores.iter_mut().for_each(|s| *s *= scale);
                for r in scores.chunks_exact_mut(n) {
                    softmax_row(r);
                }
                tmp.resize(bq * hd, 0.0);
                gemm_bf16(scores, bq, n, n, v, tmp, hd, false, 1);
                for (i, r) in tmp.chunks_exact(hd).enumerate() {
                    unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), dst.add(i * d), hd) };
                }
                return;
            }
            let k = qkv[d + h * hd..].as_ptr();
            let v = qkv[2 * d + h * hd..].as_ptr();
            unsafe {
                // scores (bq × n) = scale · q_blk (bq × hd) · kᵀ (hd × n)
                gemm::gemm(bq, n, hd, scores.as_mut_ptr(), 1, n as isize, false, q.as_ptr(), 1, row as isize, k, row as isize, 1, 0.0, scale, false, false, false, gemm::Parallelism::None);
            }
            for r in scores.chunks_exact_mut(n) {
                softmax_row(r);
            }
            unsafe {
                // out_blk (bq × hd) = scores (bq × n) · v (n × hd)
                gemm::gemm(bq, hd, n, dst, 1, d as isize, false, scores.as_ptr(), 1, n as isize, v, 1, row as isize, 0.0, 1.0, false, false, false, gemm::Parallelism::None);
            }
        });
        out
    }
}

impl CustomOp1 for AttentionOp {
    fn name(&self) -> &'static str {
        "mha-from-qkv"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, d3) = layout.shape().dims2()?;
        let d = d3 / 3;
        if d3 % 3 != 0 || d % self.num_heads != 0 {
            candle_core::bail!("attention: qkv width {d3} does not split into 3 x {} heads", self.num_heads);
        }
        let CpuStorage::F32(data) = storage else { candle_core::bail!("attention: only f32 is supported") };
        let Some((start, end)) = layout.contiguous_offsets() else { candle_core::bail!("attention: qkv must be contiguous") };
        let out = self.run(&data[start..end], n, d);
        Ok((CpuStorage::F32(out), Shape::from((n, d))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_neg_is_accurate_over_the_softmax_range() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let got = exp_neg(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_7;
        }
        assert!(worst < 3e-7, "worst relative error {worst:e}");
        assert_eq!(exp_neg(0.0), 1.0);
        assert!(exp_neg(-1000.0) < 1e-37);
    }

    #[test]
    fn softmax_rows_sum_to_one_and_match_the_definition() {
        let row: Vec<f32> = (0..100).map(|i| ((i * 37) % 23) as f32 * 0.7 - 5.0).collect();
        let mut got = row.clone();
        softmax_row(&mut got);
        let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
        let z: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
        for (g, v) in got.iter().zip(&row) {
            let want = (*v as f64 - max).exp() / z;
            assert!((*g as f64 - want).abs() < 1e-6 * want.max(1e-3), "{g} vs {want}");
        }
    }
}
