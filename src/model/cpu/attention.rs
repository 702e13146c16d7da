//! Multi-head self-attention softmax(q kᵀ/√d) v straight from the fused qkv projection
//! (N, 3·D), never materialising the (heads, N, N) score tensor: each task takes one head and
//! a block of query rows, so its scores (block × N) stay in cache, and softmax runs in place
//! with an exp that the compiler vectorises (libm's is scalar and dominated the encoder).

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape};
use rayon::prelude::*;

use crate::simd::isa::{self, Isa};
use crate::simd::math::{softmax_columns, softmax_row};
use crate::simd::sgemm::{self, Lhs, Micro, Panels};
use crate::simd::{Lines, Mat, MatMut, SendPtr};

use super::matmul::bf16::{gemm_bf16, softmax_product, PackedB};
use super::matmul::gemm::{Gemm, Strided};
use super::matmul::pointwise::Pointwise;

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
                    // Packed from qkv's rows in place (no gathered copy of the head's columns).
                    let k = Mat::from_slice(&qkv[d + h * hd..], n, hd, row);
                    let v = Mat::from_slice(&qkv[2 * d + h * hd..], n, hd, row);
                    (PackedB::build_view(k, true, level), PackedB::build_view(v, false, level))
                })
            })
            .collect();
        // f32 with a one-tap kernel (`sgemm::Micro`): per head, k (n × hd) packed once as the
        // kernel's row tiles, v (n × hd) as its column panels and qᵀ (hd × n, rows padded to
        // whole column blocks), for sᵀ = k · q_blkᵀ and p · v (`transposed`).
        let micro = if self.bf16 { None } else { Micro::at(level) };
        let np = micro.map_or(n, |m| n.div_ceil(m.cols()) * m.cols());
        let tiles: Vec<Option<Head>> = (0..heads)
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
                Some(Head { k, v: Panels::for_micro(micro, &qkv[2 * d + h * hd..], n, hd, row, 1), qt })
            })
            .collect();
        let zeros = vec![0f32; n];
        // Not zeroed: the blocks below write every element (each route writes its block of
        // `dst`, it does not add to it), on every thread.
        let mut out: Vec<f32> = Vec::with_capacity(n * d);
        let out_ptr = SendPtr(out.as_mut_ptr());
        let q_block = if micro.is_some() { Q_BLOCK_TILES } else { Q_BLOCK };
        let blocks: Vec<(usize, usize)> = (0..heads).flat_map(|h| (0..n).step_by(q_block).map(move |q0| (h, q0))).collect();
        blocks.par_iter().for_each(|&(h, q0)| {
            crate::simd::with_local(&SCRATCH, |s| {
                let bq = q_block.min(n - q0);
                let q = &qkv[q0 * row + h * hd..];
                // This block's rows of this head's columns of `out` (n × d): heads write disjoint
                // column ranges and blocks disjoint rows.
                let dst = Mat::from_mut_ptr(out_ptr.get(), n, d, d).block(q0, h * hd, bq, hd);
                if let Some((kt, v)) = &packed[h] {
                    // The products' outputs with rows on cache lines, which the AMX tiles write in
                    // place (elsewhere they go through a copy).
                    let (ns, hdp) = (n.next_multiple_of(16), hd.next_multiple_of(16));
                    if s.lines.len() < bq * (ns + hdp) {
                        s.lines = Lines::zeros(bq * (ns + hdp));
                    }
                    let (scores, tmp) = s.lines[..bq * (ns + hdp)].split_at_mut(bq * ns);
                    gemm_bf16(Mat::from_slice(q, bq, hd, row), kt, Mat::from_slice_mut(scores, bq, n, ns), false, 1);
                    // The exps straight into bf16 pairs, times v; each query's row divided by its
                    // sum on the way to `out`.
                    s.sums.resize(bq, 0.0);
                    softmax_product(Mat::from_slice(scores, bq, n, ns), scale, v, Mat::from_slice_mut(tmp, bq, hd, hdp), &mut s.sums);
                    for ((i, r), &z) in tmp.chunks_exact(hdp).enumerate().zip(&s.sums) {
                        // SAFETY: row i of `dst` is hd floats of `out`, this task's alone; `tmp` is
                        // another buffer.
                        let o = unsafe { std::slice::from_raw_parts_mut(dst.row(i), hd) };
                        let inv = 1.0 / z;
                        o.iter_mut().zip(&r[..hd]).for_each(|(o, &v)| *o = v * inv);
                    }
                    return;
                }
                if let Some(head) = &tiles[h] {
                    let qt = Mat::from_slice(&head.qt, hd, np, np).block(0, q0, hd, bq.div_ceil(head.k.cols()) * head.k.cols());
                    // SAFETY: `dst` is this task's part of `out` (above), which nothing else reaches.
                    unsafe { transposed(head, qt, scale, level, &zeros, s, dst) };
                    return;
                }
                let k = qkv[d + h * hd..].as_ptr();
                let v = qkv[2 * d + h * hd..].as_ptr();
                let dst = dst.ptr();
                let scores = &mut s.scores;
                scores.resize(bq * n, 0.0);
                // SAFETY: `scores` holds bq rows of n, q bq rows of hd (`row` apart) and k n rows of
                // hd (`row` apart) within qkv (n rows of 3d, checked by the op).
                unsafe {
                    // scores (bq × n) = scale · q_blk (bq × hd) · kᵀ (hd × n)
                    Gemm::new(bq, n, hd).scale(scale).run(Strided::rows(scores.as_mut_ptr(), n), Strided::rows(q.as_ptr(), row), Strided::cols(k, row));
                }
                for r in scores.chunks_exact_mut(n) {
                    softmax_row(level, r, 1.0);
                }
                // SAFETY: `dst` is this task's bq rows of hd floats of `out`, d apart (above); v is n
                // rows of hd within qkv, `scores` bq rows of n.
                unsafe {
                    // out_blk (bq × hd) = scores (bq × n) · v (n × hd)
                    Gemm::new(bq, hd, n).run(Strided::rows(dst, d), Strided::rows(scores.as_ptr(), n), Strided::rows(v, row));
                }
            })
        });
        // SAFETY: the blocks cover every (head, query block), and each wrote its bq rows of the
        // head's hd columns: all n · d floats of the capacity.
        unsafe { out.set_len(n * d) };
        out
    }
}

/// One head's operands on the one-tap kernels' route, prepared once per head: k (n × hd) as
/// the kernel's row tiles, v (n × hd) as its column panels, and qᵀ (hd × n, rows padded to
/// whole column blocks).
struct Head {
    k: Pointwise,
    v: Panels,
    qt: Vec<f32>,
}

thread_local! {
    /// A thread's buffers, kept between blocks and calls (one per task zeroed ~0.5 MiB).
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// A thread's buffers for its blocks.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    tmp: Vec<f32>,
    pack: Vec<f32>,
    /// The bf16 route's scores and output, on cache lines.
    lines: Lines<f32>,
    /// The bf16 route's sums of each query's exps.
    sums: Vec<f32>,
}

/// One head's block of queries through the one-tap kernel, keys along rows: sᵀ (n × bqp) =
/// k · q_blkᵀ, a softmax down each column (unnormalised, so the exps of a query are a column
/// of sᵀ and the row of p that the product with v packs as one copy per key), out_blk = p · v,
/// then each query's row divided by its sum. `qt` is the block's columns of qᵀ (hd × bq rounded
/// up to whole column blocks); the block's bq queries are `dst`'s rows (bq × hd). Nothing of
/// the size of the scores is repacked but p's tiles.
///
/// # Safety
/// Every element of `dst` is writable, and nothing else reads or writes them meanwhile.
unsafe fn transposed(head: &Head, qt: Mat<&[f32]>, scale: f32, level: Isa, zeros: &[f32], s: &mut Scratch, dst: MatMut<f32>) {
    let (n, bq, bqp) = (head.v.k(), dst.rows(), qt.cols());
    let Scratch { scores, tmp: sums, pack, .. } = s;
    scores.resize(n * bqp, 0.0);
    sums.resize(bqp, 0.0);
    head.k.product(qt, zeros, Mat::from_slice_mut(scores, n, bqp, bqp));
    softmax_columns(level, scores, bqp, scale, sums);
    // SAFETY: `dst` is the caller's to write (its promise).
    unsafe { sgemm::product(Lhs::Columns(Mat::from_slice(scores, n, bq, bqp)), &head.v, None, None, dst, pack) };
    for (i, &z) in sums.iter().enumerate().take(bq) {
        let inv = 1.0 / z;
        // SAFETY: row i of `dst`, written just above and reached by nothing else.
        unsafe { std::slice::from_raw_parts_mut(dst.row(i), dst.cols()) }.iter_mut().for_each(|o| *o *= inv);
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

    /// bf16 attention (q, k, v and the probabilities rounded to bf16, sums in f32) at every
    /// level this machine can run against f64, within bf16's rounding: more than one query
    /// block (n > 64) and tails of every kind.
    #[test]
    fn bf16_attention_matches_reference_at_every_level() {
        let mut seed = 0x1b87_3593_5b4f_1d3au64;
        for &(n, d, heads) in &[(37, 128, 2), (130, 64, 1), (19, 48, 2)] {
            let qkv: Vec<f32> = crate::simd::test_values(&mut seed, n * 3 * d).iter().map(|v| 2.0 * v).collect();
            let want = reference(&qkv, n, d, heads);
            for level in isa::levels() {
                let got = isa::with_isa(level, || AttentionOp { num_heads: heads, bf16: true, isa: level }.run(&qkv, n, d));
                let worst = got.iter().zip(&want).fold(0f64, |m, (&g, &w)| m.max((g as f64 - w).abs() / (1.0 + w.abs())));
                eprintln!("bf16 attention {level} n={n} d={d} heads={heads}: worst {worst:e}");
                // bf16's 8-bit mantissa: inputs and probabilities off by up to 2^-9 each (seen
                // here: 2.9e-3 to 4.4e-3).
                assert!(worst <= 1e-2, "{level} n={n} d={d} heads={heads}: worst {worst:e}");
            }
        }
    }
}
