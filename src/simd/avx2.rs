//! The f32 register-tile kernel for AVX2 + FMA, over any number of taps: the 3x3 convolution's
//! direct route at AVX2 (nine taps, `crate::model::cpu::conv3x3`) and the one-tap products of
//! `super::sgemm::Micro::Avx2` (linears, attention, 1x1 and transposed convolutions,
//! Winograd). It does the AVX-512F kernels' arithmetic (bias, then one FMA per tap and input
//! channel in the same order, then the residual), so the routes give the same bits, on a
//! register tile that fits 16 ymm registers.
//!
//! The kernel runs only where the CPU has AVX2 and FMA: at `Isa::Avx2` or above (the direct
//! route's `Isa::Avx2`, or a `Micro::Avx2`), which `super::isa` gives only there.

use core::arch::x86_64::*;

use super::mat::Prefetch;
use super::mat::{MatMut, MatRef};

/// Rows (output channels) of one register tile: 6 x 2 ymm accumulators, two slab vectors and
/// a broadcast weight: 15 of the 16 registers (`sgemm::Micro::row_tiles` cuts rows in these).
pub(crate) const ROWS: usize = 6;

/// C = bias + Σ_taps A · B_tap [+ add] for one register tile: C (`c`) is mv × nv (mv ≤ 6, nv ≤
/// 16). A (`a`) is the tile's packed weights (`super::sgemm::packed_index`), one row per inner index (the
/// taps' channels in turn, `taps.len() · b.rows()` rows) holding the mv weights of that index
/// side by side, rows `a.stride()` apart (≥ mv: the tile's height where it was packed). B_tap
/// is `b` moved on by `taps[t]` elements: `b.rows()` channels of 16 pixels, every one of the 16
/// read whatever `nv` (which masks only the added rows and the stores). `bias` holds mv values,
/// one per row; `add` (mv × nv) is added at the end, its stride 0 for one row of columns added
/// to every row. `pf.count` lines of 16 floats from `pf.start` are requested into L2 as the
/// first tap goes, one per channel (`sgemm::product`'s next panel; none for the convolutions).
///
/// # Safety
/// The CPU has AVX2 and FMA; every element of `a`, `bias` and `add` is readable, B_tap's 16
/// columns of each row for every tap, and every element of `c` is writable.
#[inline]
pub(crate) unsafe fn kernel(a: MatRef<f32>, b: MatRef<f32>, taps: &[usize], bias: *const f32, add: Option<MatRef<f32>>, c: MatMut<f32>, pf: Prefetch) {
    debug_assert!(c.cols() <= 16 && a.cols() == c.rows() && a.rows() == taps.len() * b.rows());
    macro_rules! go {
        ($($r:literal)*) => {
            match c.rows() {
                // SAFETY: the caller's promise, passed on; R = mv.
                $($r => unsafe { kern::<$r>(a, b, taps, bias, add, c, pf) },)*
                _ => unreachable!(),
            }
        };
    }
    go!(1 2 3 4 5 6)
}

/// [`kernel`] for R = mv rows.
///
/// # Safety
/// As [`kernel`].
#[target_feature(enable = "avx2,fma")]
unsafe fn kern<const R: usize>(a: MatRef<f32>, b: MatRef<f32>, taps: &[usize], bias: *const f32, add: Option<MatRef<f32>>, c: MatMut<f32>, pf: Prefetch) {
    let (lda, cs, cin, nv) = (a.stride(), b.stride(), b.rows(), c.cols());
    if let Some(add) = add {
        // The residual rows, read at the end, requested now (a prefetch never faults).
        for r in 0..R {
            _mm_prefetch::<_MM_HINT_T0>(add.row(r) as *const i8);
        }
    }
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for (r, acc) in acc.iter_mut().enumerate() {
        // SAFETY: `bias` holds R readable values (the caller's promise).
        let b = _mm256_set1_ps(unsafe { *bias.add(r) });
        *acc = [b, b];
    }
    // One inner index: B's row, each row of A broadcast, two FMAs each.
    macro_rules! step {
        ($at:ident, $b:ident) => {
            // SAFETY: `$b` is a row of this tap's B, 16 readable floats, and `$at` a row of A,
            // R readable weights (the caller's promise).
            unsafe {
                let b0 = _mm256_loadu_ps($b);
                let b1 = _mm256_loadu_ps($b.add(8));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let ar = _mm256_set1_ps(*$at.add(r));
                    acc[0] = _mm256_fmadd_ps(ar, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(ar, b1, acc[1]);
                }
            }
            // The next rows (past the last ones after the last step: never read).
            $b = $b.wrapping_add(cs);
            $at = $at.wrapping_add(lda);
        };
    }
    // `pf`'s lines requested one per inner index of the first tap, in a loop of their own (a
    // test in the one loop cost the convolutions 2-5 %).
    for (t, &tap) in taps.iter().enumerate() {
        let mut at = a.row(t * cin);
        let mut b = b.ptr().wrapping_add(tap);
        let fetch = if t == 0 { pf.count.min(cin) } else { 0 };
        for i in 0..fetch {
            _mm_prefetch::<_MM_HINT_T1>(pf.start.wrapping_add(16 * i) as *const i8);
            step!(at, b);
        }
        for _ in fetch..cin {
            step!(at, b);
        }
    }
    if nv >= 16 {
        // A whole tile: plain loads and stores (masked ones are microcoded on AMD).
        for (r, acc) in acc.iter_mut().enumerate() {
            let cr = c.row(r);
            // SAFETY: row r of `add` and of `c` hold 16 readable (writable) floats: nv of them.
            unsafe {
                if let Some(add) = add {
                    let ar = add.row(r);
                    acc[0] = _mm256_add_ps(acc[0], _mm256_loadu_ps(ar));
                    acc[1] = _mm256_add_ps(acc[1], _mm256_loadu_ps(ar.add(8)));
                }
                _mm256_storeu_ps(cr, acc[0]);
                _mm256_storeu_ps(cr.add(8), acc[1]);
            }
        }
        return;
    }
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nv as i32), lane);
    let m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nv as i32 - 8), lane);
    for (r, acc) in acc.iter_mut().enumerate() {
        let cr = c.row(r);
        // SAFETY: the masks cover the first nv floats of each row, which `add` and `c` hold; the
        // masked-off lanes are neither read nor written (nor can they fault).
        unsafe {
            if let Some(add) = add {
                let ar = add.row(r);
                acc[0] = _mm256_add_ps(acc[0], _mm256_maskload_ps(ar, m0));
                acc[1] = _mm256_add_ps(acc[1], _mm256_maskload_ps(ar.add(8), m1));
            }
            _mm256_maskstore_ps(cr, m0, acc[0]);
            _mm256_maskstore_ps(cr.add(8), m1, acc[1]);
        }
    }
}
