//! Multi-head self-attention softmax(q kᵀ/√d) v straight from the fused qkv projection
//! (N, 3·D), never materialising the (heads, N, N) score tensor: each task takes one head and
//! a block of query rows, so its scores (block × N) stay in cache, and softmax runs in place
//! with an exp that the compiler vectorises (libm's is scalar and dominated the encoder).

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape};
use rayon::prelude::*;

use crate::simd::isa::{self, Isa};
use crate::simd::math::{softmax_columns, softmax_row};
use crate::simd::sgemm::{self, Micro, Panels};
use crate::simd::SendPtr;

use super::bf16::{gemm_bf16, PackedB};
use super::planes::Pointwise;

pub struct AttentionOp {
    pub num_heads: usize,
    /// Both products in bf16 (f32 accumulation).
    pub bf16: bool,
    /// The level of the softmax and the bf16 packing (`isa::current()` when the model was
    /// built): passed to the tasks, which run on rayon's threads.
    pub isa: Isa,
}

/// Query rows per task: 64 × 1800 scores = 450 KiB, L2-resident on the AVX-512 machines (1 MiB
/// of L2 per core).
const Q_BLOCK: usize = 64;

/// Query rows per task on the one-tap kernels' route ([`transposed`]): 32 × 1800 scores = 225
/// KiB, beside k's tiles in the 512 KiB L2 of a Zen 3 (at 64 queries, an earlier form of this
/// route took 167-195 ms for ViT-L's attention against 135-155 ms at 32,
/// `examples/encoder_bench.rs`). On an Intel Xeon's 2 MiB of L2 with the AVX-512 kernel, 64
/// and 96 were no faster.
const Q_BLOCK_TILES: usize = 32;

/// One head's rows of q, k or v (the `hd` values at `off` of each of the n rows of qkv).
fn head_rows(qkv: &[f32], n: usize, row: usize, off: usize, hd: usize) -> Vec<f32> {
    (0..n).flat_map(|i| qkv[i * row + off..][..hd].iter().copied()).collect()
}

impl AttentionOp {
    pub fn run(&self, qkv: &[f32], n: usize, d: usize) -> Vec<f32> {
        let heads = self.num_heads;
        let hd = d / heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let row = 3 * d; // qkv row stride
        let level = isa::usable(self.isa);
        // bf16: per head, kᵀ and v packed once for all query blocks.
        let packed: Vec<Option<(PackedB, PackedB)>> = (0..heads)
            .into_par_iter()
            .map(|h| {
                self.bf16.then(|| {
                    let k = head_rows(qkv, n, row, d + h * hd, hd);
                    let v = head_rows(qkv, n, row, 2 * d + h * hd, hd);
                    (PackedB::build(&k, hd, n, true, level), PackedB::build(&v, n, hd, false, level))
                })
            })
            .collect();
        // f32 with a one-tap kernel (`sgemm::Micro`): per head, k (n × hd) packed once as the
        // kernel's row tiles, v (n × hd) as its column panels and qᵀ (hd × n, rows padded to
        // whole column blocks), for sᵀ = k · q_blkᵀ and p · v (`transposed`).
        let micro = if self.bf16 { None } else { Micro::at(level) };
        let np = micro.map_or(n, |m| n.div_ceil(m.cols()) * m.cols());
        let tiles: Vec<Option<(Pointwise, Panels, Vec<f32>)>> = (0..heads)
            .into_par_iter()
            .map(|h| {
                let micro = micro?;
                // qᵀ by blocks of 16 queries, each of its rows written 16 floats at a time (a
                // float at a time, each query's writes went to hd lines).
                let mut qt = vec![0f32; hd * np];
                for i0 in (0..n).step_by(16) {
                    let q = &qkv[i0 * row + h * hd..];
                    for c in 0..hd {
                        for (i, t) in qt[c * np + i0..][..16.min(n - i0)].iter_mut().enumerate() {
                            *t = q[i * row + c];
                        }
                    }
                }
                let k = Pointwise::rows_of(micro, &qkv[d + h * hd..], row, n, hd);
                Some((k, Panels::for_micro(micro, &qkv[2 * d + h * hd..], n, hd, row, 1), qt))
            })
            .collect();
        let zeros = vec![0f32; n];
        let mut out = vec![0f32; n * d];
        let out_ptr = SendPtr(out.as_mut_ptr());
        let q_block = if micro.is_some() { Q_BLOCK_TILES } else { Q_BLOCK };
        let blocks: Vec<(usize, usize)> = (0..heads).flat_map(|h| (0..n).step_by(q_block).map(move |q0| (h, q0))).collect();
        blocks.par_iter().for_each_init(Default::default, |(scores, tmp, pack): &mut (Vec<f32>, Vec<f32>, Vec<f32>), &(h, q0)| {
            let bq = q_block.min(n - q0);
            scores.resize(bq * n, 0.0);
            let q = &qkv[q0 * row + h * hd..];
            // Heads write disjoint column ranges and blocks disjoint rows of `out`.
            let dst = unsafe { out_ptr.get().add(q0 * d + h * hd) };
            if let Some((kt, v)) = &packed[h] {
                gemm_bf16(q, bq, hd, row, kt, scores, n, false, 1);
                for r in scores.chunks_exact_mut(n) {
                    softmax_row(level, r, scale);
                }
                tmp.resize(bq * hd, 0.0);
                gemm_bf16(scores, bq, n, n, v, tmp, hd, false, 1);
                for (i, r) in tmp.chunks_exact(hd).enumerate() {
                    unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), dst.add(i * d), hd) };
                }
                return;
            }
            if let Some((k, v, qt)) = &tiles[h] {
                // Safety: the tiles exist only where their kernel is available; every buffer has
                // the rows and whole column blocks the products read and write.
                unsafe { transposed(k, v, &qt[q0..], np, bq, n, hd, scale, level, &zeros, scores, tmp, pack, dst, d) };
                return;
            }
            let k = qkv[d + h * hd..].as_ptr();
            let v = qkv[2 * d + h * hd..].as_ptr();
            unsafe {
                // scores (bq × n) = scale · q_blk (bq × hd) · kᵀ (hd × n)
                gemm::gemm(
                    bq,
                    n,
                    hd,
                    scores.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    q.as_ptr(),
                    1,
                    row as isize,
                    k,
                    row as isize,
                    1,
                    0.0,
                    scale,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
            for r in scores.chunks_exact_mut(n) {
                softmax_row(level, r, 1.0);
            }
            unsafe {
                // out_blk (bq × hd) = scores (bq × n) · v (n × hd)
                gemm::gemm(
                    bq,
                    hd,
                    n,
                    dst,
                    1,
                    d as isize,
                    false,
                    scores.as_ptr(),
                    1,
                    n as isize,
                    v,
                    1,
                    row as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        });
        out
    }
}

/// One head's block of bq queries through the one-tap kernel, keys along rows: sᵀ (n × bqp) =
/// k · q_blkᵀ, a softmax down each column (unnormalised, so the exps of a query are a column
/// of sᵀ and the row of p that the product with v packs as one copy per key), out_blk = p · v,
/// then each query's row divided by its sum. `k` (row tiles), `v` (column panels) and qᵀ are
/// prepared once per head: nothing of the size of the scores is repacked but p's tiles.
///
/// # Safety
/// `k` and `v` built for a kernel this CPU has; `qt` holds hd rows `ldq` apart with bq rounded
/// up to whole column blocks readable; `dst` bq rows of hd writable floats `d` apart;
/// `zeros` at least n zeros.
#[allow(clippy::too_many_arguments)]
unsafe fn transposed(
    k: &Pointwise,
    v: &Panels,
    qt: &[f32],
    ldq: usize,
    bq: usize,
    n: usize,
    hd: usize,
    scale: f32,
    level: Isa,
    zeros: &[f32],
    scores: &mut Vec<f32>,
    sums: &mut Vec<f32>,
    pack: &mut Vec<f32>,
    dst: *mut f32,
    d: usize,
) {
    let bqp = bq.div_ceil(k.cols()) * k.cols();
    assert!(qt.len() >= (hd - 1) * ldq + bqp, "attention: qᵀ of {} floats", qt.len());
    scores.resize(n * bqp, 0.0);
    sums.resize(bqp, 0.0);
    k.product(qt.as_ptr(), ldq, bqp, zeros, scores.as_mut_ptr(), bqp);
    softmax_columns(level, scores, bqp, scale, sums);
    sgemm::product(scores.as_ptr(), (1, bqp), bq, v, None, None, dst, d, pack);
    for (i, &z) in sums.iter().enumerate().take(bq) {
        let inv = 1.0 / z;
        std::slice::from_raw_parts_mut(dst.add(i * d), hd).iter_mut().for_each(|o| *o *= inv);
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

    /// softmax(q kᵀ/√hd) v per head in f64, from the fused (n, 3d) qkv.
    fn reference(qkv: &[f32], n: usize, d: usize, heads: usize) -> Vec<f64> {
        let hd = d / heads;
        let scale = 1.0 / (hd as f64).sqrt();
        let at = |i: usize, j: usize| qkv[i * 3 * d + j] as f64;
        let mut out = vec![0f64; n * d];
        for h in 0..heads {
            for i in 0..n {
                let logits: Vec<f64> = (0..n).map(|j| (0..hd).map(|c| at(i, h * hd + c) * at(j, d + h * hd + c)).sum::<f64>() * scale).collect();
                let max = logits.iter().copied().fold(f64::MIN, f64::max);
                let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..hd {
                    out[i * d + h * hd + c] = (0..n).map(|j| e[j] / z * at(j, 2 * d + h * hd + c)).sum();
                }
            }
        }
        out
    }

    /// f32 attention at every level this machine can run against f64: token counts that are
    /// not a multiple of 16 or of the 64-query block, head dims 64 (every MoGe-2 encoder's)
    /// and 24.
    #[test]
    fn f32_attention_matches_reference_at_every_level() {
        let mut seed = 0x853c_49e6_748f_ea9bu64;
        for &(n, d, heads) in &[(37, 128, 2), (70, 64, 1), (19, 48, 2)] {
            let qkv: Vec<f32> = crate::simd::test_values(&mut seed, n * 3 * d).iter().map(|v| 2.0 * v).collect();
            let want = reference(&qkv, n, d, heads);
            for level in isa::levels() {
                let got = isa::with_isa(level, || AttentionOp { num_heads: heads, bf16: false, isa: level }.run(&qkv, n, d));
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert!((g as f64 - w).abs() <= 2e-5 * (1.0 + w.abs()), "{level} n={n} d={d} heads={heads} [{i}]: {g} vs {w}");
                }
            }
        }
    }
}
