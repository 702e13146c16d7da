//! The f32 register-tile kernel for aarch64 NEON, 6 rows × 16 columns (24 accumulators of four
//! lanes, four B vectors and two of A: 30 of the 32 registers): with one tap
//! `super::sgemm::Micro::Neon` (the linears, attention, the 1x1 and transposed convolutions and
//! Winograd's products), with nine the 3x3 convolutions' direct route. The AVX2 kernel's
//! arithmetic (`super::avx2`): the bias, then one fused multiply-add per inner index in order,
//! then the residual; so its results are that kernel's bits.
//!
//! Every aarch64 CPU has NEON; `Micro::Neon` is given at the `neon` level and above.

use core::arch::aarch64::*;

use super::mat::Prefetch;
use super::mat::{MatMut, MatRef};

/// Rows of one register tile.
pub(crate) const ROWS: usize = 6;

/// C = bias + Σ_taps A · B_tap [+ add] for one register tile, as `super::avx2::kernel`: C
/// (`c`) mv × nv (mv ≤ 6, nv ≤ 16), A one row per inner index (the taps' channels in turn,
/// `taps.len() · b.rows()` rows, `super::sgemm::packed_index`) holding its mv values (rows
/// `a.stride()` apart), B_tap `b` moved on by `taps[t]` elements: `b.rows()` rows of 16 readable
/// floats whatever nv, `bias` mv values, `add` (mv × nv, stride 0 for one row added to every
/// row) added at the end. `pf` (the next panel, requested into L2 on x86-64) is not used: no
/// ARM core here to measure it on.
///
/// # Safety
/// Every element of `a`, `bias` and `add` is readable, B_tap's 16 columns of each of its rows
/// for every tap, and every element of `c` is writable.
#[inline]
pub(crate) unsafe fn kernel(a: MatRef<f32>, b: MatRef<f32>, taps: &[usize], bias: *const f32, add: Option<MatRef<f32>>, c: MatMut<f32>, pf: Prefetch) {
    debug_assert!(c.cols() <= 16 && a.cols() == c.rows() && a.rows() == taps.len() * b.rows());
    let _ = pf;
    macro_rules! go {
        ($($r:literal)*) => {
            match c.rows() {
                // SAFETY: the caller's promise, passed on; R = mv.
                $($r => unsafe { kern::<$r>(a, b, taps, bias, add, c) },)*
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
#[target_feature(enable = "neon")]
unsafe fn kern<const R: usize>(a: MatRef<f32>, b: MatRef<f32>, taps: &[usize], bias: *const f32, add: Option<MatRef<f32>>, c: MatMut<f32>) {
    let (lda, ldb, k, nv) = (a.stride(), b.stride(), b.rows(), c.cols());
    let mut acc = [[vdupq_n_f32(0.0); 4]; R];
    for (r, acc) in acc.iter_mut().enumerate() {
        // SAFETY: `bias` holds R readable values.
        *acc = [vdupq_n_f32(unsafe { *bias.add(r) }); 4];
    }
    for (t, &tap) in taps.iter().enumerate() {
        let (mut at, mut bt) = (a.row(t * k), b.ptr().wrapping_add(tap));
        for _ in 0..k {
            // SAFETY: `bt` is a row of B, 16 readable floats, and `at` a row of A, R readable values.
            unsafe {
                let bv = [vld1q_f32(bt), vld1q_f32(bt.add(4)), vld1q_f32(bt.add(8)), vld1q_f32(bt.add(12))];
                if R == ROWS {
                    // A whole tile's six values in two loads, used by lane (`fmla` by element: the
                    // same fused product as with the value broadcast), not six broadcasts.
                    let (a03, a45) = (vld1q_f32(at), vld1_f32(at.add(4)));
                    for (j, &bv) in bv.iter().enumerate() {
                        acc[0][j] = vfmaq_laneq_f32::<0>(acc[0][j], bv, a03);
                        acc[1][j] = vfmaq_laneq_f32::<1>(acc[1][j], bv, a03);
                        acc[2][j] = vfmaq_laneq_f32::<2>(acc[2][j], bv, a03);
                        acc[3][j] = vfmaq_laneq_f32::<3>(acc[3][j], bv, a03);
                        acc[4][j] = vfmaq_lane_f32::<0>(acc[4][j], bv, a45);
                        acc[5][j] = vfmaq_lane_f32::<1>(acc[5][j], bv, a45);
                    }
                } else {
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let ar = vld1q_dup_f32(at.add(r));
                        for (acc, &bv) in acc.iter_mut().zip(&bv) {
                            *acc = vfmaq_f32(*acc, ar, bv);
                        }
                    }
                }
            }
            // The next rows (past the last ones after the last step: never read).
            at = at.wrapping_add(lda);
            bt = bt.wrapping_add(ldb);
        }
    }
    if nv == 16 {
        for (r, acc) in acc.iter().enumerate() {
            let cr = c.row(r);
            for (j, &v) in acc.iter().enumerate() {
                // SAFETY: row r of `add` and of C hold 16 readable (writable) floats: nv of them.
                unsafe {
                    let v = match add {
                        Some(add) => vaddq_f32(v, vld1q_f32(add.row(r).add(4 * j))),
                        None => v,
                    };
                    vst1q_f32(cr.add(4 * j), v);
                }
            }
        }
        return;
    }
    for (r, acc) in acc.iter().enumerate() {
        let cr = c.row(r);
        let mut row = [0f32; 16];
        // SAFETY: `row` holds 16 floats.
        unsafe {
            for (j, v) in acc.iter().enumerate() {
                vst1q_f32(row.as_mut_ptr().add(4 * j), *v);
            }
        }
        if let Some(add) = add {
            let ar = add.row(r);
            // SAFETY: row r of `add` holds nv readable floats.
            row[..nv].iter_mut().enumerate().for_each(|(j, v)| *v += unsafe { *ar.add(j) });
        }
        // SAFETY: row r of C holds nv writable floats.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), cr, nv) };
    }
}

/// The two rows of eight columns held by a row pair's four 2 × 2 accumulator blocks (as `bfmmla`
/// leaves them: block j is (r0c2j, r0c2j+1, r1c2j, r1c2j+1)): row 0's columns 0..4 and 4..8,
/// then row 1's.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn pair_rows(acc: &[float32x4_t; 4]) -> [[float32x4_t; 2]; 2] {
    let [c01, c23, c45, c67] = [vreinterpretq_f64_f32(acc[0]), vreinterpretq_f64_f32(acc[1]), vreinterpretq_f64_f32(acc[2]), vreinterpretq_f64_f32(acc[3])];
    [
        [vreinterpretq_f32_f64(vzip1q_f64(c01, c23)), vreinterpretq_f32_f64(vzip1q_f64(c45, c67))],
        [vreinterpretq_f32_f64(vzip2q_f64(c01, c23)), vreinterpretq_f32_f64(vzip2q_f64(c45, c67))],
    ]
}
