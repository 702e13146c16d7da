//! 1x1 and 2x2-stride-2 transposed convolutions over (C, H, W) planes as single GEMMs with the
//! bias (and an optional residual) written in the same pass, instead of GEMM, permute, copy
//! and broadcast-add as separate ops.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape};
use rayon::prelude::*;

use super::contiguous;

use super::bf16::{gemm_bf16_packed_a, PackedA};

/// out (m × n) += w (m × k) · x (k × n), all row-major, on the rayon pool.
pub(crate) fn gemm_into(out: &mut [f32], w: &[f32], x: &[f32], m: usize, k: usize, n: usize) {
    let threads = rayon::current_num_threads().max(1);
    unsafe {
        gemm::gemm(m, n, k, out.as_mut_ptr(), 1, n as isize, true, w.as_ptr(), 1, k as isize, x.as_ptr(), 1, n as isize, 1.0, 1.0, false, false, false, gemm::Parallelism::Rayon(threads));
    }
}

/// out (m × n) += x (m × k) · wᵀ with w given as (n × k): a linear layer on PyTorch's
/// (out, in) weight, read in place through strides.
pub(crate) fn gemm_into_bt(out: &mut [f32], x: &[f32], w: &[f32], m: usize, k: usize, n: usize) {
    let threads = rayon::current_num_threads().max(1);
    unsafe {
        gemm::gemm(m, n, k, out.as_mut_ptr(), 1, n as isize, true, x.as_ptr(), 1, k as isize, w.as_ptr(), k as isize, 1, 1.0, 1.0, false, false, false, gemm::Parallelism::Rayon(threads));
    }
}

/// out (m × n) += w (m × k) · x (k × n), in bf16 when the weight was packed for it.
fn weights_times(out: &mut [f32], w: &[f32], packed: Option<&PackedA>, x: &[f32], m: usize, k: usize, n: usize) {
    match packed {
        Some(p) => gemm_bf16_packed_a(p, x, n, n, out, n, true, rayon::current_num_threads().max(1)),
        None => gemm_into(out, w, x, m, k, n),
    }
}

/// `nn.Conv2d(cin, cout, 1)`: weight (cout, cin), bias (cout).
pub struct Conv1x1Op {
    pub weight: candle_core::Tensor,
    pub bias: Vec<f32>,
    pub cin: usize,
    pub cout: usize,
    pub packed: Option<PackedA>,
}

impl Conv1x1Op {
    fn run(&self, x: &[f32], hw: usize, residual: Option<&[f32]>) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.cout * hw];
        out.par_chunks_mut(hw).enumerate().for_each(|(o, row)| match residual {
            Some(r) => row.iter_mut().zip(&r[o * hw..(o + 1) * hw]).for_each(|(d, s)| *d = s + self.bias[o]),
            None => row.fill(self.bias[o]),
        });
        super::with_f32(&self.weight, |w| weights_times(&mut out, w, self.packed.as_ref(), x, self.cout, self.cin, hw))?;
        Ok(out)
    }
}

impl CustomOp1 for Conv1x1Op {
    fn name(&self) -> &'static str {
        "conv1x1"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (c, h, w) = l.shape().dims3()?;
        if c != self.cin {
            candle_core::bail!("conv1x1: {c} input channels, weight expects {}", self.cin);
        }
        let out = self.run(contiguous(s, l, "conv1x1")?, h * w, None)?;
        Ok((CpuStorage::F32(out), Shape::from((self.cout, h, w))))
    }
}

/// `residual + conv1x1(x)` in one pass: `ConvStack`'s `x = x + input_blocks[i](in[i])`.
impl CustomOp2 for Conv1x1Op {
    fn name(&self) -> &'static str {
        "conv1x1-add"
    }
    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (c, h, w) = l1.shape().dims3()?;
        if c != self.cin || l2.shape().dims() != [self.cout, h, w] {
            candle_core::bail!("conv1x1-add: shapes {:?} and {:?} do not fit weight {}x{}", l1.shape(), l2.shape(), self.cout, self.cin);
        }
        let out = self.run(contiguous(s1, l1, "conv1x1")?, h * w, Some(contiguous(s2, l2, "conv1x1")?))?;
        Ok((CpuStorage::F32(out), Shape::from((self.cout, h, w))))
    }
}

/// `nn.ConvTranspose2d(cin, cout, 2, stride=2)`: weight as (cout·4, cin) with rows (o, di, dj).
pub struct ConvTranspose2x2Op {
    pub weight: candle_core::Tensor,
    pub bias: Vec<f32>,
    pub cin: usize,
    pub cout: usize,
    pub packed: Option<PackedA>,
}

impl CustomOp1 for ConvTranspose2x2Op {
    fn name(&self) -> &'static str {
        "conv-transpose-2x2"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (c, h, w) = l.shape().dims3()?;
        if c != self.cin {
            candle_core::bail!("conv-transpose: {c} input channels, weight expects {}", self.cin);
        }
        let x = contiguous(s, l, "conv-transpose")?;
        let hw = h * w;
        let mut y = vec![0f32; 4 * self.cout * hw];
        super::with_f32(&self.weight, |wt| weights_times(&mut y, wt, self.packed.as_ref(), x, 4 * self.cout, self.cin, hw))?;
        // Interleave: out[o, 2i+di, 2j+dj] = bias[o] + y[(o, di, dj), (i, j)].
        let (oh, ow) = (2 * h, 2 * w);
        let mut out = vec![0f32; self.cout * oh * ow];
        out.par_chunks_mut(oh * ow).enumerate().for_each(|(o, plane)| {
            let b = self.bias[o];
            for di in 0..2 {
                for dj in 0..2 {
                    let src = &y[(o * 4 + di * 2 + dj) * hw..(o * 4 + di * 2 + dj + 1) * hw];
                    for i in 0..h {
                        let row = &mut plane[(2 * i + di) * ow..(2 * i + di + 1) * ow];
                        for (j, v) in src[i * w..(i + 1) * w].iter().enumerate() {
                            row[2 * j + dj] = v + b;
                        }
                    }
                }
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((self.cout, oh, ow))))
    }
}
