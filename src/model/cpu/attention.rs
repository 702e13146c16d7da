//! Multi-head self-attention softmax(q kᵀ/√d) v straight from the fused qkv projection
//! (N, 3·D), never materialising the (heads, N, N) score tensor: each task takes one head and
//! a block of query rows, so its scores (block × N) stay in cache, and softmax runs in place.

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape};
use rayon::prelude::*;

pub struct AttentionOp {
    pub num_heads: usize,
}

/// Query rows per task: 64 × 1800 scores = 450 KiB, L2-resident.
const Q_BLOCK: usize = 64;

struct SendPtr(*mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(&self) -> *mut f32 {
        self.0
    }
}

/// In-place softmax of one row, as max-subtracted exp normalised by its sum.
fn softmax_row(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
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
        let mut out = vec![0f32; n * d];
        let out_ptr = SendPtr(out.as_mut_ptr());
        let blocks: Vec<(usize, usize)> = (0..heads).flat_map(|h| (0..n).step_by(Q_BLOCK).map(move |q0| (h, q0))).collect();
        let row = 3 * d; // qkv row stride
        blocks.par_iter().for_each_init(Vec::new, |scores: &mut Vec<f32>, &(h, q0)| {
            let bq = Q_BLOCK.min(n - q0);
            scores.resize(bq * n, 0.0);
            let q = qkv[q0 * row + h * hd..].as_ptr();
            let k = qkv[d + h * hd..].as_ptr();
            let v = qkv[2 * d + h * hd..].as_ptr();
            unsafe {
                // scores (bq × n) = scale · q_blk (bq × hd) · kᵀ (hd × n)
                gemm::gemm(bq, n, hd, scores.as_mut_ptr(), 1, n as isize, false, q, 1, row as isize, k, row as isize, 1, 0.0, scale, false, false, false, gemm::Parallelism::None);
            }
            for r in scores.chunks_exact_mut(n) {
                softmax_row(r);
            }
            // Heads write disjoint column ranges and blocks disjoint rows of `out`.
            let dst = unsafe { out_ptr.get().add(q0 * d + h * hd) };
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
