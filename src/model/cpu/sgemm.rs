//! f32 products C (m × n) = A (m × k) · B (k × n) on the direct route's AVX2 kernel
//! (`conv3x3::avx2`, 6 rows × 16 columns), for the encoder's linears and attention at the
//! AVX2 level. B is packed once into 16-column panels (a linear's Wᵀ at load; attention's v
//! once per head); A is packed per task, KC values of the inner dimension at a time,
//! into the kernel's 6-row tiles. A panel's slice (KC × 16 floats, 16 KiB) stays in L1 while
//! every row tile of the task reads it, the task's packed A (≤ MC rows × KC) in L2: the loop
//! order of Goto and van de Geijn ("Anatomy of High-Performance Matrix Multiplication", 2008).
//!
//! The `gemm` crate did these products before: 110-125 GFLOP/s on ViT-S and ViT-L's linears and
//! 73-87 on attention (2 threads, Zen 3, whose AVX2 FMA peak is ~196), attention repacking kᵀ
//! and v for each block of queries (`examples/encoder_bench.rs`).

use rayon::prelude::*;

use super::isa::Isa;
use super::SendPtr;

/// Inner-dimension values per slice: a panel's slice is 16 KiB, half of L1.
const KC: usize = 256;

/// Rows per task at most (20 tiles of 6): the task's packed A slice is 120 KiB of L2.
const MC: usize = 120;

/// The kernel's per-row bias: zero (a linear's bias is a row added to every row instead).
static ZEROS: [f32; 6] = [0.0; 6];

/// B (k × n) in 16-column panels, slice-major: slice s (values s·KC.. of the inner dimension)
/// holds every panel's rows of that slice in turn, each row 16 floats (a last panel's columns
/// past n are zeros), so a task reads one slice as one stream.
pub struct Panels {
    words: Vec<f32>,
    k: usize,
    n: usize,
}

impl Panels {
    /// Whether level `level` takes these products: where the AVX2 direct route is its f32 route
    /// (the AVX-512 levels keep the `gemm` crate's AVX-512 kernels).
    pub fn available(level: Isa) -> bool {
        super::planes::Pointwise::available(level)
    }

    /// B with element (c, j) at `src[c · rs + j · cs]`.
    pub fn new(src: &[f32], k: usize, n: usize, rs: usize, cs: usize) -> Self {
        let np = n.div_ceil(16);
        let mut words = vec![0f32; k * np * 16];
        for c0 in (0..k).step_by(KC) {
            let kc = KC.min(k - c0);
            let slice = &mut words[c0 * np * 16..][..kc * np * 16];
            for (p, panel) in slice.chunks_exact_mut(kc * 16).enumerate() {
                let nv = 16.min(n - 16 * p);
                // Along whichever of B's dimensions is contiguous in `src`.
                if cs == 1 {
                    for (c, dst) in panel.chunks_exact_mut(16).enumerate() {
                        dst[..nv].copy_from_slice(&src[(c0 + c) * rs + 16 * p..][..nv]);
                    }
                } else {
                    for jj in 0..nv {
                        let col = (16 * p + jj) * cs;
                        for c in 0..kc {
                            panel[c * 16 + jj] = src[(c0 + c) * rs + col];
                        }
                    }
                }
            }
        }
        Self { words, k, n }
    }

    /// Panel p's rows of the slice starting at c0 (`kc` long).
    fn slice(&self, c0: usize, kc: usize, p: usize) -> *const f32 {
        self.words[(c0 * self.n.div_ceil(16) + p * kc) * 16..].as_ptr()
    }
}

/// C (m × n) = A · B [+ bias, a row of n added to every row] on this thread: A's (i, c) at
/// `a[i · rs + c · cs]` (k = `b`'s inner dimension values per row: `cs` 1 for rows in memory,
/// `rs` 1 for columns), C's row i at `c[i · ldc..]`; `pack` is scratch.
///
/// # Safety
/// Call only where [`Panels::available`] held for the level the panels were built at (the CPU
/// has AVX2 and FMA). `a` holds every (i, c) for i < m, c < k, `c` m rows of n writable floats
/// `ldc` apart, `bias` (when given) n floats.
#[allow(clippy::too_many_arguments)]
pub unsafe fn product(a: *const f32, (rs, cs): (usize, usize), m: usize, b: &Panels, bias: Option<&[f32]>, c: *mut f32, ldc: usize, pack: &mut Vec<f32>) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::conv3x3::avx2::{kernel, row_tiles};
        let (k, n) = (b.k, b.n);
        if let Some(bias) = bias {
            assert!(bias.len() >= n, "sgemm: bias of {} for {n} columns", bias.len());
        }
        if m == 0 || n == 0 {
            return;
        }
        let tiles = row_tiles(m);
        for c0 in (0..k.max(1)).step_by(KC) {
            let kc = KC.min(k - c0);
            // A's rows, slice c0..c0 + kc, in the kernel's tiles: (c, r) at c · rows + r.
            pack.resize(m * kc, 0.0);
            for t in tiles.windows(2) {
                let (r0, rows) = (t[0], t[1] - t[0]);
                let dst = &mut pack[r0 * kc..][..rows * kc];
                if rs == 1 {
                    // A's columns in memory: each c's rows side by side already, copied at a
                    // length known to the compiler (a call to memmove per ≤ 6 floats took 8 %
                    // of attention).
                    macro_rules! columns {
                        ($($r:literal)*) => {
                            match rows {
                                $($r => for (cc, d) in dst.chunks_exact_mut($r).enumerate() {
                                    let d: &mut [f32; $r] = d.try_into().expect("a tile's rows");
                                    *d = *(a.add(r0 + (c0 + cc) * cs) as *const [f32; $r]);
                                },)*
                                _ => unreachable!("tiles have 1 to 6 rows"),
                            }
                        };
                    }
                    columns!(1 2 3 4 5 6);
                } else {
                    for r in 0..rows {
                        for cc in 0..kc {
                            dst[cc * rows + r] = *a.add((r0 + r) * rs + (c0 + cc) * cs);
                        }
                    }
                }
            }
            for p in 0..n.div_ceil(16) {
                let panel = b.slice(c0, kc, p) as *const u32;
                let nv = (n - 16 * p).min(16);
                for t in tiles.windows(2) {
                    let (r0, rows) = (t[0], t[1] - t[0]);
                    let out = c.add(r0 * ldc + 16 * p);
                    // The first slice adds the bias row (or nothing); the next ones what the
                    // slices before left in C.
                    let (add, add_ld) = match (c0, bias) {
                        (0, Some(bias)) => (bias.as_ptr().add(16 * p), 0),
                        (0, None) => (std::ptr::null(), 0),
                        _ => (out as *const f32, ldc),
                    };
                    kernel(rows, pack.as_ptr().add(r0 * kc), &[panel], 16, kc, ZEROS.as_ptr(), add, add_ld, out, ldc, nv);
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (a, rs, cs, m, b, bias, c, ldc, pack);
}

/// y (m × n) = x (m × k) · B + bias on every thread, in tasks of whole row tiles.
///
/// # Safety
/// As [`product`]: only where [`Panels::available`] held when `b` was built.
pub unsafe fn linear(x: &[f32], m: usize, b: &Panels, bias: &[f32]) -> Vec<f32> {
    let (k, n) = (b.k, b.n);
    assert!(x.len() >= m * k && bias.len() >= n, "sgemm: operand sizes");
    let mut y: Vec<f32> = Vec::with_capacity(m * n);
    #[cfg(target_arch = "x86_64")]
    let tiles = super::conv3x3::avx2::row_tiles(m);
    // Elsewhere `Panels::available` never holds and this is not called; one task if it were.
    #[cfg(not(target_arch = "x86_64"))]
    let tiles = vec![0, m];
    let nt = tiles.len() - 1;
    // At least one task per thread, each at most MC rows, the tiles spread evenly.
    let threads = rayon::current_num_threads().max(1);
    let tasks = nt.div_ceil(MC / 6).div_ceil(threads).max(1) * threads;
    let tasks = tasks.min(nt);
    let y_ptr = SendPtr(y.as_mut_ptr());
    (0..tasks).into_par_iter().for_each_init(Vec::new, |pack, i| {
        let (r0, r1) = (tiles[nt * i / tasks], tiles[nt * (i + 1) / tasks]);
        // Safety: tasks write disjoint rows of `y`; `x` has m rows of k.
        product(x[r0 * k..].as_ptr(), (k, 1), r1 - r0, b, Some(bias), y_ptr.get().add(r0 * n), n, pack);
    });
    // Safety: every row was a task's; each wrote its rows' n columns.
    y.set_len(m * n);
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::{isa, test_values};

    /// Products against f64 at the AVX2 level where this machine has it: m not a multiple of
    /// the tiles, n not of the panels, k below, at and past a slice (and with two slices'
    /// remainder), B packed from both layouts (Wᵀ read across rows and a plain row-major B),
    /// with and without the bias row. Each entry within 1e-5 of the sum of its terms'
    /// magnitudes.
    #[test]
    fn products_match_reference() {
        let level = isa::Isa::Avx2;
        if !isa::levels().any(|l| l == level) || !isa::with_isa(level, || Panels::available(level)) {
            eprintln!("no AVX2 direct route on this machine: skipped");
            return;
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for &(m, k, n) in &[(1, 5, 3), (7, 64, 16), (13, 256, 33), (37, 300, 50), (64, 600, 64), (121, 40, 17)] {
            let a = test_values(&mut seed, m * k);
            let w = test_values(&mut seed, n * k); // (n, k): Wᵀ is B
            let bias = test_values(&mut seed, n);
            let want = |i: usize, j: usize, with_bias: bool| -> (f64, f64) {
                let terms = (0..k).map(|c| a[i * k + c] as f64 * w[j * k + c] as f64);
                let b = if with_bias { bias[j] as f64 } else { 0.0 };
                (terms.clone().sum::<f64>() + b, terms.map(f64::abs).sum::<f64>() + b.abs())
            };
            let wt = isa::with_isa(level, || Panels::new(&w, k, n, 1, k));
            // The same B given row-major (k × n).
            let b_rows: Vec<f32> = (0..k).flat_map(|c| (0..n).map(move |j| (c, j))).map(|(c, j)| w[j * k + c]).collect();
            let rm = isa::with_isa(level, || Panels::new(&b_rows, k, n, n, 1));
            for (label, panels) in [("wt", &wt), ("rows", &rm)] {
                let mut pack = Vec::new();
                // Rows of ldc = n + 3: columns past n stay as they were.
                let ldc = n + 3;
                let mut c = vec![7f32; m * ldc];
                unsafe { product(a.as_ptr(), (k, 1), m, panels, None, c.as_mut_ptr(), ldc, &mut pack) };
                // A given by columns (k × m in memory): the same products.
                let at: Vec<f32> = (0..k).flat_map(|cc| (0..m).map(move |i| (i, cc))).map(|(i, cc)| a[i * k + cc]).collect();
                let mut ct = vec![7f32; m * ldc];
                unsafe { product(at.as_ptr(), (1, m), m, panels, None, ct.as_mut_ptr(), ldc, &mut pack) };
                assert_eq!(c, ct, "{label} m={m} k={k} n={n}: A by columns");
                let y = unsafe { linear(&a, m, panels, &bias) };
                for i in 0..m {
                    for j in 0..n {
                        let (v, mag) = want(i, j, false);
                        let got = c[i * ldc + j] as f64;
                        assert!((got - v).abs() <= 1e-5 * mag + 1e-6, "{label} m={m} k={k} n={n} [{i},{j}]: {got} vs {v}");
                        let (v, mag) = want(i, j, true);
                        let got = y[i * n + j] as f64;
                        assert!((got - v).abs() <= 1e-5 * mag + 1e-6, "{label} linear m={m} k={k} n={n} [{i},{j}]: {got} vs {v}");
                    }
                    assert!(c[i * ldc + n..(i + 1) * ldc].iter().all(|&v| v == 7.0), "{label} m={m} n={n}: wrote past n");
                }
            }
        }
    }
}
