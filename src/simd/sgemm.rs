//! f32 products C (m × n) = A (m × k) · B (k × n) on a one-tap register-tile kernel
//! ([`Micro`]: the AVX2 kernel, `super::avx2`, 6 rows × 16 columns, which the 3x3 convolution's
//! direct route runs with nine taps, or its AVX-512F twin, `super::avx512::one_tap`, 14 rows ×
//! 32 columns; on aarch64 `super::neon`, 6 × 16), for the encoder's linears and attention. B is packed once into column panels of the kernel's width (a linear's Wᵀ at
//! load; attention's v once per head); A is packed per task, KC values of the inner dimension
//! at a time, into the kernel's row tiles. A panel's slice (KC × width floats) stays in L1
//! while every row tile of the task reads it, the task's packed A (≤ MC rows × KC) in L2: the
//! loop order of Goto and van de Geijn ("Anatomy of High-Performance Matrix Multiplication",
//! 2008).
//!
//! The `gemm` crate did these products before: 110-125 GFLOP/s on ViT-S and ViT-L's linears and
//! 73-87 on attention (2 threads, Zen 3, whose AVX2 FMA peak is ~196), attention repacking kᵀ
//! and v for each block of queries (`examples/encoder_bench.rs`).

use rayon::prelude::*;

use super::isa::{self, Isa};
use super::mat::{Mat, MatMut, MatRef, Prefetch};
use super::{Lines, SendPtr};

/// Rows per task at most: the task's packed A slice (≤ MC × KC floats) stays in L2.
const MC: usize = 120;

/// Inner-dimension values per slice: a panel's slice (16 KiB at 16 columns, 32 KiB at 32)
/// stays in L1 beside the row tile being read. At 32 columns, 128 / 384 / 512 / 1024 were no
/// faster on an Intel Xeon with 48 KiB of L1 (`examples/encoder_bench.rs`, ViT-L).
const KC: usize = 256;

/// The kernel's per-row bias: zero (a linear's bias is a row added to every row instead).
static ZEROS: [f32; 16] = [0.0; 16];

/// Where weight (row r of a tile of `rows` rows, tap t, channel c) sits in a tile's packed
/// block for the 6-row kernels with taps (AVX2's and NEON's, the 3x3 convolutions' direct
/// route): the tile's weights for one (tap, channel) side by side, read in one stream
/// ([`Micro::pack`]'s layout, its inner index t · cin + c).
#[inline(always)]
pub(crate) fn packed_index(rows: usize, cin: usize, r: usize, t: usize, c: usize) -> usize {
    (t * cin + c) * rows + r
}

/// The f32 one-tap register-tile kernel of a level, chosen when its operands are packed and
/// kept beside them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Micro {
    /// AVX2 + FMA, 6 rows × 16 columns (`super::avx2::kernel` with one tap).
    Avx2,
    /// AVX-512F, 14 rows × 32 columns (`super::avx512::one_tap`).
    Avx512,
    /// aarch64 NEON, 6 rows × 16 columns (`super::neon::kernel` with one tap).
    Neon,
}

impl Micro {
    /// The kernel of level `level`, where it has one.
    pub fn at(level: Isa) -> Option<Micro> {
        match isa::usable(level) {
            Isa::Avx2 => Some(Micro::Avx2),
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => Some(Micro::Avx512),
            Isa::Neon | Isa::Dotprod | Isa::I8mm | Isa::Bf16 => Some(Micro::Neon),
            Isa::Portable => None,
        }
    }

    /// Whether this CPU has the kernel's instructions: always for a `Micro` from [`Micro::at`];
    /// checked where one comes from outside, before a product runs it.
    pub fn runs_here(self) -> bool {
        match self {
            Micro::Avx2 => isa::detected() >= Isa::Avx2,
            Micro::Avx512 => isa::detected() >= Isa::Avx512,
            Micro::Neon => cfg!(target_arch = "aarch64") && isa::detected() >= Isa::Neon,
        }
    }

    /// Rows of a full register tile.
    pub fn rows(self) -> usize {
        #[cfg(target_arch = "x86_64")]
        match self {
            Micro::Avx2 => super::avx2::ROWS,
            Micro::Avx512 => super::avx512::ONE_TAP_ROWS,
            Micro::Neon => 6,
        }
        #[cfg(target_arch = "aarch64")]
        match self {
            Micro::Neon => super::neon::ROWS,
            // x86-64's kernels are not built here (`Micro::at` gives none): any height packs
            // and is never read.
            Micro::Avx2 => 6,
            Micro::Avx512 => 14,
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        match self {
            Micro::Avx2 | Micro::Neon => 6,
            Micro::Avx512 => 14,
        }
    }

    /// Columns of a register tile (of B's panels), every one read.
    pub fn cols(self) -> usize {
        match self {
            Micro::Avx2 | Micro::Neon => 16,
            Micro::Avx512 => 32,
        }
    }

    /// m rows in tiles of ≤ [`Micro::rows`] rows of equal height (a short tail tile would run
    /// latency-bound): tile t is rows [b[t], b[t + 1]).
    pub fn row_tiles(self, m: usize) -> Vec<usize> {
        let tiles = m.div_ceil(self.rows()).max(1);
        (0..=tiles).map(|t| m * t / tiles).collect()
    }

    /// C = bias + A · B [+ add] for one register tile, C (`c`) mv × nv (mv ≤ [`Micro::rows`],
    /// nv ≤ [`Micro::cols`]): A (`a`) one row per inner index holding its mv values side by
    /// side (a packed tile: stride mv), B (`b`) a row per inner index with [`Micro::cols`]
    /// readable floats whatever nv, `bias` mv values, `add` (mv × nv, stride 0 for one row added
    /// to every row) added at the end; `pf` requested into L2 on the way (those lines past the
    /// inner indices are not).
    ///
    /// # Safety
    /// [`Micro::runs_here`]; every element of `a`, `bias` and `add` is readable, B's
    /// [`Micro::cols`] columns of each of its `a.rows()` rows, and every element of `c` is
    /// writable.
    #[inline]
    pub(crate) unsafe fn kernel(self, a: MatRef<f32>, b: MatRef<f32>, bias: *const f32, add: Option<MatRef<f32>>, c: MatMut<f32>, pf: Prefetch) {
        #[cfg(target_arch = "x86_64")]
        match self {
            // SAFETY: the caller's promise (with one tap at offset 0, B is the tap's rows).
            Micro::Avx2 => unsafe { super::avx2::kernel(a, b, &[0], bias, add, c, pf) },
            // SAFETY: the caller's promise.
            Micro::Avx512 => unsafe { super::avx512::one_tap(a, b, bias, add, c, pf) },
            Micro::Neon => unreachable!("sgemm: the NEON kernel on x86-64"),
        }
        #[cfg(target_arch = "aarch64")]
        match self {
            // SAFETY: the caller's promise (with one tap at offset 0, B is the tap's rows).
            Micro::Neon => unsafe { super::neon::kernel(a, b, &[0], bias, add, c, pf) },
            _ => unreachable!("sgemm: an x86-64 kernel on aarch64"),
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let _ = (a, b, bias, add, c, pf);
    }

    /// dst[c · rows + r] = a[r][c] for every element of `a`: a tile of A's rows packed for
    /// [`Micro::kernel`]. Gathered, an inner index's `rows` values by one instruction, at
    /// AVX-512 (the scalar copy, a load and a store per value, was 3 % of a ViT-L forward's
    /// samples).
    pub(crate) fn pack(self, a: Mat<&[f32]>, dst: &mut [f32]) {
        let (rows, kc) = (a.rows(), a.cols());
        assert!(dst.len() >= rows * kc, "sgemm: a tile of {rows} x {kc} in {}", dst.len());
        #[cfg(target_arch = "x86_64")]
        if self == Micro::Avx512 && self.runs_here() && rows <= 16 && a.stride().checked_mul(4 * rows).is_some_and(|b| b <= i32::MAX as usize) {
            // SAFETY: the CPU has AVX-512F (`runs_here`); the rest `pack_rows` checks itself.
            unsafe { super::avx512::pack_rows(a, dst) };
            return;
        }
        for r in 0..rows {
            for (c, &v) in a.row(r).iter().enumerate() {
                dst[c * rows + r] = v;
            }
        }
    }
}

/// B (k × n) in column panels of the kernel's width w, slice-major: slice s (values s·KC.. of
/// the inner dimension) holds every panel's rows of that slice in turn, each row w floats (a
/// last panel's columns past n are zeros), so a task reads one slice as one stream.
pub struct Panels {
    words: Lines,
    k: usize,
    n: usize,
    micro: Micro,
}

impl Panels {
    /// Whether the linears of level `level` take these products: wherever it has a kernel. At
    /// AVX-512 the `gemm` crate's kernels were 5-10 % faster on ViT-L's linears until the next
    /// panel was fetched ahead and fc1's GELU done on each finished tile (`product`).
    pub fn available(level: Isa) -> bool {
        Micro::at(level).is_some()
    }

    /// B with element (c, j) at `src[c · rs + j · cs]`, for this thread's level
    /// (`isa::current`); where it has no kernel (never asked: see [`Micro::at`]), the AVX2
    /// layout, which no product reads.
    pub fn new(src: &[f32], k: usize, n: usize, rs: usize, cs: usize) -> Self {
        Self::for_micro(Micro::at(isa::current()).unwrap_or(Micro::Avx2), src, k, n, rs, cs)
    }

    /// [`Panels::new`] for kernel `micro`.
    pub fn for_micro(micro: Micro, src: &[f32], k: usize, n: usize, rs: usize, cs: usize) -> Self {
        let w = micro.cols();
        let np = n.div_ceil(w);
        let mut words = Lines::zeros(k * np * w);
        for c0 in (0..k).step_by(KC) {
            let kc = KC.min(k - c0);
            let slice = &mut words[c0 * np * w..][..kc * np * w];
            for (p, panel) in slice.chunks_exact_mut(kc * w).enumerate() {
                let nv = w.min(n - w * p);
                // Along whichever of B's dimensions is contiguous in `src`.
                if cs == 1 {
                    for (c, dst) in panel.chunks_exact_mut(w).enumerate() {
                        dst[..nv].copy_from_slice(&src[(c0 + c) * rs + w * p..][..nv]);
                    }
                } else {
                    for jj in 0..nv {
                        let col = (w * p + jj) * cs;
                        for c in 0..kc {
                            panel[c * w + jj] = src[(c0 + c) * rs + col];
                        }
                    }
                }
            }
        }
        Self { words, k, n, micro }
    }

    /// Rows of B: the inner dimension.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns of B.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Panel p's rows of the slice starting at c0 (`kc` long).
    fn slice(&self, c0: usize, kc: usize, p: usize) -> *const f32 {
        let w = self.micro.cols();
        self.words[(c0 * self.n.div_ceil(w) + p * kc) * w..].as_ptr()
    }
}

/// The left operand A (m × k) of [`product`], its rows in memory or its columns.
#[derive(Clone, Copy, Debug)]
pub enum Lhs<'a> {
    /// A itself (m × k): its tiles are packed for the kernel.
    Rows(Mat<&'a [f32]>),
    /// Aᵀ (k × m): each inner index's values side by side already, as in a packed tile, so the
    /// kernel reads them in place (attention's p: copying them took 6 % of attention).
    Columns(Mat<&'a [f32]>),
}

/// C (m × n) = A · B [+ bias, a row of n added to every row] [then GELU at level `gelu`] on
/// this thread, k = `b`'s inner dimension; `pack` is scratch.
///
/// # Safety
/// Every element of `c` (m × n) is writable, and nothing else reads or writes them meanwhile.
pub unsafe fn product(a: Lhs, b: &Panels, bias: Option<&[f32]>, gelu: Option<Isa>, c: MatMut<f32>, pack: &mut Vec<f32>) {
    let (k, n, micro) = (b.k, b.n, b.micro);
    let w = micro.cols();
    let (m, inner) = match a {
        Lhs::Rows(a) => (a.rows(), a.cols()),
        Lhs::Columns(at) => (at.cols(), at.rows()),
    };
    assert!(micro.runs_here(), "sgemm: {micro:?} panels on a CPU without the kernel");
    assert!(inner == k && c.rows() == m && c.cols() == n, "sgemm: A {m} x {inner}, B {k} x {n}, C {} x {}", c.rows(), c.cols());
    if let Some(bias) = bias {
        assert!(bias.len() >= n, "sgemm: bias of {} for {n} columns", bias.len());
    }
    if m == 0 || n == 0 {
        return;
    }
    let tiles = micro.row_tiles(m);
    for c0 in (0..k.max(1)).step_by(KC) {
        let kc = KC.min(k - c0);
        // A's rows, slice c0..c0 + kc, in the kernel's tiles: (c, r) at c · rows + r (A's
        // columns in memory are read in place).
        if let Lhs::Rows(a) = a {
            pack.resize(m * kc, 0.0);
            for t in tiles.windows(2) {
                let (r0, rows) = (t[0], t[1] - t[0]);
                micro.pack(a.block(r0, c0, rows, kc), &mut pack[r0 * kc..][..rows * kc]);
            }
        }
        let np = n.div_ceil(w);
        let nt = tiles.len() - 1;
        for p in 0..np {
            let panel = b.slice(c0, kc, p);
            let nv = (n - w * p).min(w);
            // The next panel's slice requested into L2, a share per row tile, one line per
            // inner index by the kernel: read cold by a task's first tile, it came from L3 at
            // the pace of the kernel's loads. ViT-L's linears a block (`examples/encoder_bench.rs`,
            // Intel Xeon): 251 -> 218 ms at AVX-512 with the requests all made before each tile,
            // 218 -> 196 with them spread through it; 369 -> 358 ms at AVX2.
            let lines = kc * w / 16;
            let next = (p + 1 < np).then(|| b.slice(c0, kc, p + 1));
            for (ti, t) in tiles.windows(2).enumerate() {
                let pf = match next {
                    Some(next) => Prefetch { start: next.wrapping_add(16 * (lines * ti / nt)), count: lines * (ti + 1) / nt - lines * ti / nt },
                    None => Prefetch::NONE,
                };
                let (r0, rows) = (t[0], t[1] - t[0]);
                let out = c.block(r0, w * p, rows, nv);
                // The first slice adds the bias row (or nothing); the next ones what the
                // slices before left in C.
                let add = match (c0, bias) {
                    (0, Some(bias)) => Some(Mat::from_ptr(bias.as_ptr().wrapping_add(w * p), rows, nv, 0)),
                    (0, None) => None,
                    _ => Some(out.as_const()),
                };
                let at = match a {
                    Lhs::Columns(at) => at.as_raw().block(c0, r0, kc, rows),
                    Lhs::Rows(_) => Mat::from_ptr(pack.as_ptr().wrapping_add(r0 * kc), kc, rows, rows),
                };
                // SAFETY: `micro` runs here (asserted); A's tile is inside `a` (a checked view)
                // or `pack` (rows · kc packed values), B's slice of panel p has kc rows of w
                // floats, the bias row n floats (asserted), and `out` is inside `c`, which the
                // caller gives this call alone.
                unsafe { micro.kernel(at, Mat::from_ptr(panel, kc, w, w), ZEROS.as_ptr(), add, out, pf) };
                // GELU on the finished tile while it is in L1.
                if let (Some(level), true) = (gelu, c0 + kc >= k) {
                    for r in 0..rows {
                        // SAFETY: row r of `out` is nv floats of `c`, written just above and
                        // reached by nothing else meanwhile (the caller's promise).
                        super::math::gelu_in_place(level, unsafe { std::slice::from_raw_parts_mut(out.row(r), nv) });
                    }
                }
            }
        }
    }
}

/// y (m × n) = x (m × k) · B + bias [then GELU at level `gelu`] on every thread, in tasks of
/// whole row tiles.
pub fn linear(x: &[f32], m: usize, b: &Panels, bias: &[f32], gelu: Option<Isa>) -> Vec<f32> {
    let (k, n) = (b.k, b.n);
    assert!(x.len() >= m * k && bias.len() >= n, "sgemm: operand sizes");
    let mut y: Vec<f32> = Vec::with_capacity(m * n);
    let tiles = b.micro.row_tiles(m);
    let nt = tiles.len() - 1;
    // At least one task per thread, each at most MC rows, the tiles spread evenly.
    let threads = rayon::current_num_threads().max(1);
    let tasks = nt.div_ceil((MC / b.micro.rows()).max(1)).div_ceil(threads).max(1) * threads;
    let tasks = tasks.min(nt);
    let y_ptr = SendPtr(y.as_mut_ptr());
    (0..tasks).into_par_iter().for_each_init(Vec::new, |pack, i| {
        let (r0, r1) = (tiles[nt * i / tasks], tiles[nt * (i + 1) / tasks]);
        let a = Mat::from_slice(&x[r0 * k..], r1 - r0, k, k);
        // SAFETY: `y` has room for m rows of n; tasks write disjoint rows of it, r0..r1 this one.
        unsafe { product(Lhs::Rows(a), b, Some(bias), gelu, Mat::from_mut_ptr(y_ptr.get().wrapping_add(r0 * n), r1 - r0, n, n), pack) };
    });
    // SAFETY: every row was a task's, and each wrote its rows' n columns; m · n is within the
    // capacity.
    unsafe { y.set_len(m * n) };
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{isa, test_values};

    /// Products against f64 with every kernel this machine has: m not a multiple of the tiles,
    /// n not of the panels, k below, at and past a slice (and with two slices' remainder), B
    /// packed from both layouts (Wᵀ read across rows and a plain row-major B), with and
    /// without the bias row. Each entry within 1e-5 of the sum of its terms' magnitudes.
    #[test]
    fn products_match_reference() {
        let micros: Vec<Micro> = isa::levels().filter_map(Micro::at).fold(Vec::new(), |mut v, m| {
            if !v.contains(&m) {
                v.push(m);
            }
            v
        });
        if micros.is_empty() {
            eprintln!("no f32 kernel on this machine: skipped");
            return;
        }
        for micro in micros {
            products_match_reference_with(micro);
        }
    }

    fn products_match_reference_with(micro: Micro) {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for &(m, k, n) in &[(1, 5, 3), (7, 64, 16), (13, 256, 33), (37, 300, 50), (64, 600, 64), (121, 40, 17), (29, 520, 97), (15, 33, 32)] {
            let a = test_values(&mut seed, m * k);
            let w = test_values(&mut seed, n * k); // (n, k): Wᵀ is B
            let bias = test_values(&mut seed, n);
            let want = |i: usize, j: usize, with_bias: bool| -> (f64, f64) {
                let terms = (0..k).map(|c| a[i * k + c] as f64 * w[j * k + c] as f64);
                let b = if with_bias { bias[j] as f64 } else { 0.0 };
                (terms.clone().sum::<f64>() + b, terms.map(f64::abs).sum::<f64>() + b.abs())
            };
            let wt = Panels::for_micro(micro, &w, k, n, 1, k);
            // The same B given row-major (k × n).
            let b_rows: Vec<f32> = (0..k).flat_map(|c| (0..n).map(move |j| (c, j))).map(|(c, j)| w[j * k + c]).collect();
            let rm = Panels::for_micro(micro, &b_rows, k, n, n, 1);
            for (label, panels) in [("wt", &wt), ("rows", &rm)] {
                let mut pack = Vec::new();
                // Rows of ldc = n + 3: columns past n stay as they were.
                let ldc = n + 3;
                let mut c = vec![7f32; m * ldc];
                let out = |c: &mut Vec<f32>| Mat::from_slice_mut(c, m, n, ldc).as_raw_mut();
                // SAFETY: `c` is this thread's, m rows of ldc floats.
                unsafe { product(Lhs::Rows(Mat::from_slice(&a, m, k, k)), panels, None, None, out(&mut c), &mut pack) };
                // A given by columns (k × m in memory): the same products.
                let at: Vec<f32> = (0..k).flat_map(|cc| (0..m).map(move |i| (i, cc))).map(|(i, cc)| a[i * k + cc]).collect();
                let mut ct = vec![7f32; m * ldc];
                // SAFETY: as above.
                unsafe { product(Lhs::Columns(Mat::from_slice(&at, k, m, m)), panels, None, None, out(&mut ct), &mut pack) };
                assert_eq!(c, ct, "{micro:?} {label} m={m} k={k} n={n}: A by columns");
                let y = linear(&a, m, panels, &bias, None);
                for i in 0..m {
                    for j in 0..n {
                        let (v, mag) = want(i, j, false);
                        let got = c[i * ldc + j] as f64;
                        assert!((got - v).abs() <= 1e-5 * mag + 1e-6, "{micro:?} {label} m={m} k={k} n={n} [{i},{j}]: {got} vs {v}");
                        let (v, mag) = want(i, j, true);
                        let got = y[i * n + j] as f64;
                        assert!((got - v).abs() <= 1e-5 * mag + 1e-6, "{micro:?} {label} linear m={m} k={k} n={n} [{i},{j}]: {got} vs {v}");
                    }
                    assert!(c[i * ldc + n..(i + 1) * ldc].iter().all(|&v| v == 7.0), "{label} m={m} n={n}: wrote past n");
                }
            }
        }
    }
}
