//! 3x3 convolution with replicate padding by Winograd's F(2x2, 3x3) (Lavin and Gray, "Fast
//! Algorithms for Convolutional Neural Networks", 2016), the f32 route at the levels with a
//! one-tap kernel (AVX2, AVX-512F, NEON: `super::winograd_level`).
//!
//! Each 2x2 block of output pixels ("tile") is Aᵀ [Σ_c U_c ⊙ V_c] A with V_c = Bᵀ d_c B the
//! transformed 4x4 input patch of channel c and U_c = G g_c Gᵀ the transformed 3x3 weight:
//! for each of the 16 positions ξ of the 4x4 transform, one product (cout × cin) · (cin ×
//! tiles), 16 · cin multiply-adds per tile and output channel where the direct convolution
//! needs 36. The products are the level's one-tap kernel ([`Pointwise`], `sgemm::Micro`);
//! the transforms are additions only (B and A hold 0 and ±1; G's halves are applied to the
//! weights once, in f64, at load).
//!
//! Not the direct route's bits: the sums run in another order through the transforms. The
//! rounding stays that of a convolution's (`conv3x3`'s tests bound it by 1e-5 of the sum of the terms'
//! magnitudes, as the direct route's), far inside the parity gates.

use rayon::prelude::*;

use crate::simd::isa;
use crate::simd::sgemm::Micro;
use crate::simd::{Mat, SendPtr};

use crate::model::cpu::matmul::pointwise::Pointwise;

/// The 16 transform positions ξ = 4i + j of a tile.
const XI: usize = 16;

/// Floats between one position's block of the transformed input (and output) and the next,
/// past the block itself: one cache line.
const XI_PAD: usize = 16;

/// Bytes of one task's transformed input and output (16 · (cin + cout) floats per tile), in
/// L2 beside the weights streaming through.
const TASK_BYTES: usize = 512 * 1024;

pub struct Winograd {
    /// U[ξ] (cout × cin) packed for the kernel, one per position.
    u: Vec<Pointwise>,
    zeros: Vec<f32>,
    cin: usize,
    cout: usize,
    /// The kernel's columns: tiles are taken in blocks of this many.
    cols: usize,
}

impl Winograd {
    /// Whether the route pays at these channel counts on `level`'s kernels. Against the direct
    /// route, each shape side by side in one run (`conv3x3_bench`, and the model's convolutions
    /// timed in a ViT-S forward): on a Zen 3 (AVX2) 1.6-1.8x at 256 channels, 1.25-1.5x at 128,
    /// 1.0-1.3x at 64, 0.9-1.1x at 32 (the short products and the transforms weigh more
    /// there); on an Intel Xeon at AVX-512, where the direct route's 14x32 tile runs at 260-310
    /// GFLOP/s on 2 cores, 1.2-1.6x at 256 but 0.45-0.66x at 128 and 64, and a ViT-S f32 image
    /// 1.11x faster (4.64-4.72 s to 4.20-4.21 s, alternated) with the direct route below 256.
    /// Not measured on AMD's AVX-512 (Zen 4 and 5), whose default is bf16 (no Winograd there).
    pub fn worth(level: isa::Isa, cin: usize, cout: usize) -> bool {
        let min = Self::min_channels(level);
        cin >= min && cout >= min
    }

    /// The channels in and out from which [`Winograd::worth`] takes the route at `level`. NEON
    /// (below AVX2 in the order) takes AVX2's 64: a kernel of the same shape, unmeasured on
    /// Arm hardware.
    pub fn min_channels(level: isa::Isa) -> usize {
        if level >= isa::Isa::Avx512 {
            256
        } else {
            64
        }
    }

    /// From a (cout, cin, 3, 3) weight, for this thread's one-tap kernel (`sgemm::Micro`);
    /// `None` where the level has none.
    pub fn new(w: &[f32], cin: usize, cout: usize) -> Option<Self> {
        let micro = Micro::at(isa::current())?;
        // U = G g Gᵀ per (o, c), G = [[1, 0, 0], [½, ½, ½], [½, -½, ½], [0, 0, 1]], in f64.
        const G: [[f64; 3]; 4] = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]];
        let mut u = vec![vec![0f32; cout * cin]; XI];
        for o in 0..cout {
            for c in 0..cin {
                let g = &w[(o * cin + c) * 9..][..9];
                for i in 0..4 {
                    for j in 0..4 {
                        let mut s = 0f64;
                        for (ky, gi) in G[i].iter().enumerate() {
                            for (kx, gj) in G[j].iter().enumerate() {
                                s += gi * g[ky * 3 + kx] as f64 * gj;
                            }
                        }
                        u[i * 4 + j][o * cin + c] = s as f32;
                    }
                }
            }
        }
        let u = u.iter().map(|m| Pointwise::for_micro(micro, m, cout, cin)).collect();
        Some(Self { u, zeros: vec![0.0; cout], cin, cout, cols: micro.cols() })
    }

    /// out (cout, h, w) = bias + conv(x) [+ residual], x (cin, h, w), through a ReLU first when
    /// asked.
    pub fn run(&self, x: &[f32], h: usize, w: usize, relu: bool, bias: &[f32], residual: Option<&[f32]>) -> Vec<f32> {
        let (cin, cout) = (self.cin, self.cout);
        assert!(x.len() >= cin * h * w && bias.len() == cout && residual.is_none_or(|r| r.len() >= cout * h * w), "winograd: operand sizes");
        let mut out: Vec<f32> = Vec::with_capacity(cout * h * w);
        if h == 0 || w == 0 || cout == 0 {
            return out;
        }
        let (th, tw) = (h.div_ceil(2), w.div_ceil(2));
        // Tasks of whole blocks of the kernel's columns, at most TASK_BYTES' worth, over the
        // tiles in row-major order: a task's columns are segments of one or more tile rows side
        // by side. With tasks inside a tile row, a row of 49 or 98 tiles (the neck's maps at
        // 1800 tokens) took 64 or 128 columns: a quarter of the products on padding.
        let cols = self.cols;
        let per = (TASK_BYTES / (4 * XI * (cin + cout))).max(cols) / cols;
        let blocks = (th * tw).div_ceil(cols);
        let chunks = blocks.div_ceil(per);
        let per = cols * blocks.div_ceil(chunks);
        let tasks: Vec<Vec<Segment>> = (0..chunks).map(|k| segments(k * per, ((k + 1) * per).min(th * tw), tw)).filter(|t| !t.is_empty()).collect();
        let out_ptr = SendPtr(out.as_mut_ptr());
        let level = isa::current();
        tasks.par_iter().for_each_init(Scratch::default, |s, task| {
            let n = task.iter().map(|g| g.n).sum::<usize>();
            let np = n.div_ceil(cols) * cols;
            // Each position's block one cache line past a multiple of np: 16 streams a power of
            // two apart map to one L1 set, more than its ways.
            let (vs, ms) = (cin * np + XI_PAD, cout * np + XI_PAD);
            s.v.resize(XI * vs, 0.0);
            s.m.resize(XI * ms, 0.0);
            s.y.resize(4 * cout * np, 0.0);
            // The task reads 4 short row segments of every channel's plane per segment: too many
            // streams for the hardware prefetchers to find, so each channel's are requested two
            // channels ahead (without this the input transform waited on memory: ~10 % of a
            // ViT-S forward).
            let ahead = |c: usize| {
                if c < cin {
                    for g in task {
                        let (x0, len) = ((2 * g.tx0).saturating_sub(1), (2 * g.n + 2).min(w - (2 * g.tx0).saturating_sub(1).min(w)));
                        for i in 0..4 {
                            let y = (2 * g.ty + i).saturating_sub(1).min(h - 1);
                            prefetch(&x[(c * h + y) * w + x0..][..len]);
                        }
                    }
                }
            };
            ahead(0);
            ahead(1);
            for c in 0..cin {
                ahead(c + 2);
                // Segments in column order: a segment's transform writes whole blocks of 8
                // tiles, its last block's tail overwritten by the next segment's (the last
                // one's within np, or the XI_PAD past the last channel).
                for g in task {
                    let stride = g.n.div_ceil(8) * 8 + 1;
                    s.eo.resize(8 * stride, 0.0);
                    // The segment's columns of V[ξ][c], for every ξ.
                    let v = Mat::from_slice_mut(&mut s.v[c * np + g.col..], XI, stride - 1, vs);
                    input_tile_row(level, Mat::from_slice(&x[c * h * w..], h, w, w), (g.ty, g.tx0), relu, &mut s.eo[..8 * stride], v);
                }
            }
            for (xi, u) in self.u.iter().enumerate() {
                // V[ξ] (cin × np, np a multiple of the kernel's columns) to M[ξ] (cout × np).
                u.product(Mat::from_slice(&s.v[xi * vs..], cin, np, np), &self.zeros, Mat::from_slice_mut(&mut s.m[xi * ms..], cout, np, np));
            }
            transform_out(level, &s.m, np, ms, cout, bias, &mut s.y);
            // Each segment's pixels inside the map, with the residual.
            for g in task {
                let (x0, nx) = (2 * g.tx0, (2 * g.n).min(w - 2 * g.tx0));
                for o in 0..cout {
                    for a in 0..2 {
                        let yy = 2 * g.ty + a;
                        if yy >= h {
                            break;
                        }
                        let src = &s.y[(o * 2 + a) * 2 * np + 2 * g.col..][..nx];
                        let i = (o * h + yy) * w + x0;
                        // SAFETY: `out` has room for cout · h · w floats, i + nx of them; tasks
                        // write disjoint tiles of it, each pixel exactly once (never read before
                        // `set_len`).
                        let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(i), nx) };
                        store_row(level, src, residual.map(|r| &r[i..i + nx]), dst);
                    }
                }
            }
        });
        // SAFETY: every tile row and column was a task, and each wrote all its pixels, within the
        // capacity.
        unsafe { out.set_len(cout * h * w) };
        out
    }
}

/// Tiles tx0..tx0 + n of tile row ty, at column `col` of a task's transformed blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    ty: usize,
    tx0: usize,
    n: usize,
    col: usize,
}

/// Tiles t0..t1 in row-major order (rows of `tw`) as segments of whole tile rows' runs.
fn segments(t0: usize, t1: usize, tw: usize) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut t = t0;
    while t < t1 {
        let (ty, tx0) = (t / tw, t % tw);
        let n = (tw - tx0).min(t1 - t);
        out.push(Segment { ty, tx0, n, col: t - t0 });
        t += n;
    }
    out
}

/// Asks for `s`'s cache lines (a hint: no effect on results, none where the target has no
/// prefetch instruction).
#[inline(always)]
fn prefetch(s: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for i in (0..s.len()).step_by(16) {
        // SAFETY: SSE, which every x86-64 CPU has; a prefetch reads nothing and never faults.
        unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(s.as_ptr().wrapping_add(i) as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = s;
}

#[derive(Default)]
struct Scratch {
    /// V[ξ][c][tile], rows of np, positions `XI_PAD` floats past their blocks apart.
    v: Vec<f32>,
    /// M[ξ][o][tile], rows of np, likewise.
    m: Vec<f32>,
    /// The four input rows' even and odd columns.
    eo: Vec<f32>,
    /// Y[o][row][x] of the tile row, with the bias.
    y: Vec<f32>,
}

crate::simd::dispatch! {
    /// V[ξ][t] of one channel for the tiles `tile` = (ty, tx0).. of tile row ty of its (h, w) plane, into row
    /// ξ of `v` (its columns a multiple of 8 tiles: those past the map's edge are clamped
    /// copies, computed and never kept). `eo` is scratch of 8 rows of `v.cols()` + 1.
    fn input_tile_row / input_tile_row_baseline(plane: Mat<&[f32]>, tile: (usize, usize), relu: bool, eo: &mut [f32], v: Mat<&mut [f32]>) {
        let ((h, w), (ty, tx0)) = ((plane.rows(), plane.cols()), tile);
        let stride = eo.len() / 8;
        assert_eq!(v.cols() + 1, stride, "winograd: scratch for {} tiles", v.cols());
        // Row i of the patch is map row 2ty - 1 + i and column j map column 2tx - 1 + j, clamped
        // (replicate padding): e[i][k] = column 2(tx0 + k) - 1, o[i][k] = column 2(tx0 + k).
        let (e, o) = eo.split_at_mut(4 * stride);
        let base = 2 * tx0;
        // e[k] = row[base + 2k - 1], o[k] = row[base + 2k] where both are inside the row: k in
        // lo..hi, a plain de-interleave; clamped reads at the two ends.
        let lo = usize::from(base == 0);
        let hi = if base < w { ((w - 1 - base) / 2 + 1).min(stride) } else { 0 }.max(lo);
        for i in 0..4 {
            let y = (2 * ty + i).saturating_sub(1).min(h - 1);
            let row = plane.row(y);
            let (ei, oi) = (&mut e[i * stride..][..stride], &mut o[i * stride..][..stride]);
            let col = |x: usize| row[x.saturating_sub(1).min(w - 1)];
            for k in (0..lo).chain(hi..stride) {
                (ei[k], oi[k]) = (col(base + 2 * k), col(base + 2 * k + 1));
            }
            if hi > lo {
                let pairs = row[base + 2 * lo - 1..base + 2 * hi - 1].chunks_exact(2);
                for ((pe, po), p) in ei[lo..hi].iter_mut().zip(&mut oi[lo..hi]).zip(pairs) {
                    (*pe, *po) = (p[0], p[1]);
                }
            }
            if relu {
                ei.iter_mut().chain(oi.iter_mut()).for_each(|v| *v = v.max(0.0));
            }
        }
        transform_in(e, o, stride, v);
    }
}

/// V = Bᵀ d B over `stride - 1` tiles (a multiple of 8) side by side, position ξ's into row ξ
/// of `v`, Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]: patch column j of
/// tile t is e[t], o[t], e[t + 1], o[t + 1] of its row.
#[inline(always)]
fn transform_in(e: &[f32], o: &[f32], stride: usize, mut v: Mat<&mut [f32]>) {
    let ld = |a: &[f32], i: usize, t: usize| -> [f32; 8] { a[i * stride + t..][..8].try_into().expect("8 floats") };
    for t0 in (0..stride - 1).step_by(8) {
        // r[i][j]: patch row i times B (columns combined).
        let mut r = [[[0f32; 8]; 4]; 4];
        for (i, ri) in r.iter_mut().enumerate() {
            let (e0, o0, e1, o1) = (ld(e, i, t0), ld(o, i, t0), ld(e, i, t0 + 1), ld(o, i, t0 + 1));
            for l in 0..8 {
                ri[0][l] = e0[l] - e1[l];
                ri[1][l] = o0[l] + e1[l];
                ri[2][l] = e1[l] - o0[l];
                ri[3][l] = o0[l] - o1[l];
            }
        }
        for j in 0..4 {
            let [r0, r1, r2, r3] = r.map(|ri| ri[j]);
            let rows: [[f32; 8]; 4] = [
                std::array::from_fn(|l| r0[l] - r2[l]),
                std::array::from_fn(|l| r1[l] + r2[l]),
                std::array::from_fn(|l| r2[l] - r1[l]),
                std::array::from_fn(|l| r1[l] - r3[l]),
            ];
            for (i, val) in rows.iter().enumerate() {
                v.row_mut(i * 4 + j)[t0..][..8].copy_from_slice(val);
            }
        }
    }
}

crate::simd::dispatch! {
    /// Y = Aᵀ M A + bias for every output channel over np tiles (a multiple of 8), Aᵀ = [[1, 1,
    /// 1, 0], [0, 1, -1, -1]], into y[o][a][2t + b] (rows of 2 · np); M[ξ] starts at ξ ·
    /// `xi_stride`.
    fn transform_out / transform_out_baseline(m: &[f32], np: usize, xi_stride: usize, cout: usize, bias: &[f32], y: &mut [f32]) {
        for (o, yo) in y.chunks_exact_mut(4 * np).enumerate().take(cout) {
            let (y0, y1) = yo.split_at_mut(2 * np);
            for t0 in (0..np).step_by(8) {
                let ld = |xi: usize| -> [f32; 8] { m[xi * xi_stride + o * np + t0..][..8].try_into().expect("8 floats") };
                // s[a][j] = (Aᵀ M)[a][j]
                let mut s = [[[0f32; 8]; 4]; 2];
                let [s0, s1] = &mut s;
                for (j, (s0, s1)) in s0.iter_mut().zip(s1.iter_mut()).enumerate() {
                    let (m0, m1, m2, m3) = (ld(j), ld(4 + j), ld(8 + j), ld(12 + j));
                    for l in 0..8 {
                        s0[l] = m0[l] + m1[l] + m2[l];
                        s1[l] = m1[l] - m2[l] - m3[l];
                    }
                }
                let b = bias[o];
                for (a, row) in [&mut *y0, &mut *y1].into_iter().enumerate() {
                    let sa = &s[a];
                    let out: &mut [f32; 16] = (&mut row[2 * t0..][..16]).try_into().expect("16 floats");
                    for l in 0..8 {
                        out[2 * l] = b + (sa[0][l] + sa[1][l] + sa[2][l]);
                        out[2 * l + 1] = b + (sa[1][l] - sa[2][l] - sa[3][l]);
                    }
                }
            }
        }
    }
}

crate::simd::dispatch! {
    /// dst = src [+ residual].
    fn store_row / store_row_baseline(src: &[f32], residual: Option<&[f32]>, dst: &mut [f32]) {
        match residual {
            Some(r) => dst.iter_mut().zip(src).zip(r).for_each(|((d, &v), &r)| *d = v + r),
            None => dst.copy_from_slice(src),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task's segments cover its tiles once, in order, each within one tile row, at the
    /// columns of their place in the task.
    #[test]
    fn segments_cover_the_tiles_in_order() {
        for (t0, t1, tw) in [(0, 32, 49), (32, 64, 49), (40, 100, 7), (5, 6, 1), (0, 300, 150), (96, 98, 98)] {
            let segs = segments(t0, t1, tw);
            let tiles: Vec<(usize, usize, usize)> = segs.iter().flat_map(|g| (0..g.n).map(move |i| (g.ty, g.tx0 + i, g.col + i))).collect();
            let want: Vec<(usize, usize, usize)> = (t0..t1).map(|t| (t / tw, t % tw, t - t0)).collect();
            assert_eq!(tiles, want, "tiles {t0}..{t1} of rows of {tw}");
            assert!(segs.iter().all(|g| g.n > 0 && g.tx0 + g.n <= tw), "{segs:?}");
        }
    }
}
