//! The f32 product of a weight packed once for a one-tap register-tile kernel
//! ([`crate::simd::sgemm::Micro`]): the 1x1 and transposed convolutions, attention's products
//! and Winograd's all take it from here. On the decoder's shapes (a few hundred rows by up to
//! 460 000 pixels) it beat the `gemm` crate by 1.16x warm and 2-3x in a first forward
//! (PERFORMANCE.md, step 15).

use rayon::prelude::*;

use crate::simd::isa::{self, Isa};
use crate::simd::mat::Prefetch;
use crate::simd::sgemm::Micro;
use crate::simd::{Mat, SendPtr};

/// A (m × k) f32 weight packed for a one-tap register-tile kernel ([`Micro`]: the AVX2 kernel of
/// the direct 3x3 route, `crate::simd::avx2`, or its AVX-512F twin): rows in its row tiles, each
/// tile's weights interleaved, so a product streams them in one pass.
pub struct Pointwise {
    words: Vec<f32>,
    m: usize,
    k: usize,
    micro: Micro,
}

/// Pixels per task: a task's input columns (k × this, ≤ 128 KiB) stay in L2 while every
/// weight tile reads them; a multiple of the kernel's `cols`.
fn pixels_per_task(k: usize, cols: usize) -> usize {
    ((32 * 1024 / k.max(1)) / cols * cols).clamp(cols, 2048)
}

/// Bytes of weights per block of row tiles, beside a task's input columns in L2.
const WEIGHT_BLOCK_BYTES: usize = 192 * 1024;

impl Pointwise {
    /// Whether level `level` runs f32 1x1 and transposed convolutions here: where it has a
    /// one-tap kernel ([`Micro::at`]).
    pub fn available(level: Isa) -> bool {
        Micro::at(level).is_some()
    }

    /// The packed weight for this thread's level; `None` where it has no one-tap kernel.
    pub fn new(w: &[f32], m: usize, k: usize) -> Option<Self> {
        Self::new_at(isa::current(), w, m, k)
    }

    /// [`Pointwise::new`] for level `level` (inside rayon's tasks, where `isa::with_isa` does
    /// not reach).
    pub fn new_at(level: Isa, w: &[f32], m: usize, k: usize) -> Option<Self> {
        Micro::at(level).map(|micro| Self::for_micro(micro, w, m, k))
    }

    /// W packed for kernel `micro`.
    pub fn for_micro(micro: Micro, w: &[f32], m: usize, k: usize) -> Self {
        Self::rows_of(micro, w, k, m, k)
    }

    /// [`Pointwise::for_micro`] for a W (m × k) whose rows are `ldw` floats apart in `w`
    /// (attention's k, read from the rows of qkv).
    pub fn rows_of(micro: Micro, w: &[f32], ldw: usize, m: usize, k: usize) -> Self {
        assert!(m == 0 || w.len() >= (m - 1) * ldw + k, "pointwise: {} floats for {m} rows of {k}, {ldw} apart", w.len());
        let mut words = vec![0f32; m * k];
        let w = Mat::from_slice(w, m, k, ldw);
        for tile in micro.row_tiles(m).windows(2) {
            let (r0, rows) = (tile[0], tile[1] - tile[0]);
            micro.pack(w.block(r0, 0, rows, k), &mut words[r0 * k..][..rows * k]);
        }
        Self { words, m, k, micro }
    }

    /// The kernel's columns: a product reads x in blocks of this many.
    pub fn cols(&self) -> usize {
        self.micro.cols()
    }

    /// out (m × n) = W · x on this thread: x is (k × a multiple of [`Pointwise::cols`]), read
    /// in whole blocks of that many columns, of which out (m × n) keeps the first n; `zeros`
    /// has m zeros (the kernel's bias). Panics where the shapes disagree.
    pub(in crate::model::cpu) fn product(&self, x: Mat<&[f32]>, zeros: &[f32], mut out: Mat<&mut [f32]>) {
        let (w, n) = (self.micro.cols(), out.cols());
        assert!(self.micro.runs_here(), "pointwise: {:?} weights on a CPU without the kernel", self.micro);
        assert!(
            x.rows() == self.k && out.rows() == self.m && x.cols().is_multiple_of(w) && n <= x.cols() && zeros.len() >= self.m,
            "pointwise: operand shapes"
        );
        let (x, out) = (x.as_raw(), out.as_raw_mut());
        let b = self.micro.row_tiles(self.m);
        for t in 0..b.len() - 1 {
            let (r0, r1) = (b[t], b[t + 1]);
            let a = Mat::from_ptr(self.words.as_ptr().wrapping_add(r0 * self.k), self.k, r1 - r0, r1 - r0);
            for x0 in (0..n).step_by(w) {
                // SAFETY: the CPU has the kernel (asserted); the tile's packed weights are inside
                // `words` (m · k), x's block of w columns inside `x` (whole blocks, asserted),
                // `zeros` has m values and the output tile is inside `out`, borrowed mutably.
                unsafe { self.micro.kernel(a, x.block(0, x0, self.k, w), zeros.as_ptr(), None, out.block(r0, x0, r1 - r0, (n - x0).min(w)), Prefetch::NONE) };
            }
        }
    }

    /// out (m × n) = bias + W · x [+ residual]: x is (k × n), bias has m values, residual
    /// is (m × n).
    pub fn run(&self, x: &[f32], n: usize, bias: &[f32], residual: Option<&[f32]>) -> Vec<f32> {
        let (m, k, micro) = (self.m, self.k, self.micro);
        assert!(x.len() >= k * n && bias.len() == m && residual.is_none_or(|r| r.len() >= m * n), "pointwise: operand sizes");
        assert!(micro.runs_here(), "pointwise: {micro:?} weights on a CPU without the kernel");
        let mut out: Vec<f32> = Vec::with_capacity(m * n);
        if m == 0 || n == 0 {
            return out;
        }
        let w = micro.cols();
        let b = micro.row_tiles(m);
        let tiles = b.len() - 1;
        let nb = (m * k * 4).div_ceil(WEIGHT_BLOCK_BYTES).clamp(1, tiles);
        let chunk = pixels_per_task(k, w);
        let out_ptr = SendPtr(out.as_mut_ptr());
        let residual = residual.map(|r| Mat::from_slice(r, m, n, n));
        (0..n.div_ceil(chunk)).into_par_iter().for_each_init(Vec::new, |tail: &mut Vec<f32>, ci| {
            let out = Mat::from_mut_ptr(out_ptr.get(), m, n, n);
            let (p0, p1) = (ci * chunk, ((ci + 1) * chunk).min(n));
            for blk in 0..nb {
                for x0 in (p0..p1).step_by(w) {
                    let nv = (p1 - x0).min(w);
                    // The kernel reads `w` columns of every channel: a short last block reads a
                    // copy padded to `w`, not past the end of `x`.
                    let xb = if x0 + w <= n {
                        Mat::from_slice(&x[x0..], k, w, n)
                    } else {
                        tail.clear();
                        tail.extend((0..k).flat_map(|c| (0..w).map(move |i| if x0 + i < n { x[c * n + x0 + i] } else { 0.0 })));
                        Mat::from_slice(tail, k, w, w)
                    };
                    for t in tiles * blk / nb..tiles * (blk + 1) / nb {
                        let (r0, r1) = (b[t], b[t + 1]);
                        let a = Mat::from_ptr(self.words.as_ptr().wrapping_add(r0 * k), k, r1 - r0, r1 - r0);
                        let add = residual.map(|r| r.as_raw().block(r0, x0, r1 - r0, nv));
                        // SAFETY: the CPU has the kernel (asserted); the tile's packed weights
                        // are inside `words` (m · k), `xb` has w readable columns per channel (a
                        // checked view), the bias m values (asserted), `add` is inside the
                        // residual; `out` has room for m · n floats, tasks write disjoint
                        // columns of it (p0..p1 this one), every (row, column) exactly once.
                        unsafe { micro.kernel(a, xb.as_raw(), bias.as_ptr().wrapping_add(r0), add, out.block(r0, x0, r1 - r0, nv), Prefetch::NONE) };
                    }
                }
            }
        });
        // SAFETY: every element was written above, within the capacity.
        unsafe { out.set_len(m * n) };
        out
    }
}
