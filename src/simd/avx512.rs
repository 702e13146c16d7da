//! The AVX-512F one-tap register-tile kernel ([`one_tap`], 14 rows x 32 columns) and its tile
//! packing ([`pack_rows`]): the f32 products' kernel at the AVX-512 levels (`super::sgemm`),
//! the AVX2 kernel's arithmetic on zmm registers. The accumulator prologue (`start!`) and the
//! store masks (`masks`) are shared with the direct 3x3 convolution's AVX-512 kernels.
//!
//! Everything here runs only where the CPU has AVX-512F: a `super::sgemm::Micro::Avx512` (or
//! the direct convolution's `Isa::Avx512` route) exists only there.

use core::arch::x86_64::*;

use super::mat::Prefetch;
use super::mat::{Mat, MatMut, MatRef};

// The prologue is a macro: as a function (even `#[inline]` with the same target features) it
// was not inlined and cost 50 % of the conv time.

/// Accumulators set to the bias; the residual rows (read at the end) prefetched now, so
/// they arrive while the k loop runs. `$bias` holds `$r` readable floats and `$add` is an
/// `Option<MatRef<f32>>` of `$r` rows (the kernels' callers' promises).
macro_rules! start {
    ($r:ident, $bias:ident, $add:ident) => {{
        if let Some(add) = $add {
            for r in 0..$r {
                // A prefetch never faults.
                let p = add.row(r) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(p);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
            }
        }
        let mut acc = [[_mm512_setzero_ps(); 2]; $r];
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `$bias` holds `$r` readable floats (the kernel's caller's promise).
            let b = _mm512_set1_ps(unsafe { *$bias.add(r) });
            *acc = [b, b];
        }
        acc
    }};
}
pub(crate) use start;

/// Store masks for the first `nv` of 32 columns.
#[inline(always)]
pub(crate) fn masks(nv: usize) -> (__mmask16, __mmask16) {
    let m0: __mmask16 = if nv >= 16 { 0xffff } else { ((1u32 << nv) - 1) as u16 };
    let m1: __mmask16 = if nv >= 32 {
        0xffff
    } else if nv > 16 {
        ((1u32 << (nv - 16)) - 1) as u16
    } else {
        0
    };
    (m0, m1)
}

/// Rows of the one-tap f32 kernel's register tile ([`one_tap`]): 14 x 2 zmm accumulators, the
/// two B vectors and the broadcast A value, 31 of the 32 registers.
pub(crate) const ONE_TAP_ROWS: usize = 14;

/// C = bias + A · B [+ add] for one register tile of C (`c`, mv × nv, mv ≤ [`ONE_TAP_ROWS`],
/// nv ≤ 32): the AVX2 kernel's one-tap product (`super::avx2::kernel`, the same packing of A:
/// one row per inner index holding its mv weights side by side, rows `a.stride()` apart) on
/// 32 columns of zmm registers, for `super::sgemm::Micro` at the AVX-512 levels. B (`b`) has
/// a row of 32 readable floats per inner index (`a.rows()` of them), whatever nv; `bias` mv
/// values; `add` (mv × nv, stride 0 for one row added to every row) is added at the end.
/// `pf.count` lines of 16 floats from `pf.start` are requested into L2, one per inner index
/// (`sgemm::product`'s next panel).
///
/// # Safety
/// The CPU has AVX-512F; every element of `a`, `bias` and `add` is readable, B's 32 columns of
/// each of its `a.rows()` rows, and every element of `c` is writable.
#[inline]
pub(crate) unsafe fn one_tap(a: MatRef<f32>, b: MatRef<f32>, bias: *const f32, add: Option<MatRef<f32>>, c: MatMut<f32>, pf: Prefetch) {
    debug_assert!(c.cols() <= 32 && a.cols() == c.rows());
    macro_rules! go {
        ($($r:literal)*) => {
            match c.rows() {
                // SAFETY: the caller's promise, passed on; R = mv.
                $($r => unsafe { one_tap_rows::<$r>(a, b, bias, add, c, pf) },)*
                _ => unreachable!("one_tap: {} rows", c.rows()),
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14)
}

/// [`one_tap`] for R = mv rows.
///
/// # Safety
/// As [`one_tap`].
#[target_feature(enable = "avx512f")]
unsafe fn one_tap_rows<const R: usize>(a: MatRef<f32>, b: MatRef<f32>, bias: *const f32, add: Option<MatRef<f32>>, c: MatMut<f32>, pf: Prefetch) {
    let (lda, cs, kc, nv) = (a.stride(), b.stride(), a.rows(), c.cols());
    let mut acc = start!(R, bias, add);
    let (mut at, mut bt) = (a.ptr(), b.ptr());
    // One inner index: B's row, each row of A broadcast, two FMAs each.
    macro_rules! step {
        () => {
            // SAFETY: `bt` is a row of B, 32 readable floats, and `at` a row of A, R readable
            // weights (the caller's promise).
            unsafe {
                let b0 = _mm512_loadu_ps(bt);
                let b1 = _mm512_loadu_ps(bt.add(16));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let ar = _mm512_set1_ps(*at.add(r));
                    acc[0] = _mm512_fmadd_ps(ar, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(ar, b1, acc[1]);
                }
            }
            // The next rows (past the last ones after the last step: never read).
            bt = bt.wrapping_add(cs);
            at = at.wrapping_add(lda);
        };
    }
    // `pf`'s lines requested one per inner index, in a loop of their own (no test in the rest).
    let fetch = pf.count.min(kc);
    for i in 0..fetch {
        _mm_prefetch::<_MM_HINT_T1>(pf.start.wrapping_add(16 * i) as *const i8);
        step!();
    }
    for _ in fetch..kc {
        step!();
    }
    let (m0, m1) = masks(nv);
    for (r, acc) in acc.iter_mut().enumerate() {
        let cr = c.row(r);
        // SAFETY: row r of `add` and of `c` hold nv readable (writable) floats: all 32 where nv
        // is 32, else the masks' lanes, and masked-off lanes are neither read nor written (nor
        // can they fault).
        unsafe {
            if nv >= 32 {
                if let Some(add) = add {
                    let ar = add.row(r);
                    acc[0] = _mm512_add_ps(acc[0], _mm512_loadu_ps(ar));
                    acc[1] = _mm512_add_ps(acc[1], _mm512_loadu_ps(ar.add(16)));
                }
                _mm512_storeu_ps(cr, acc[0]);
                _mm512_storeu_ps(cr.add(16), acc[1]);
            } else {
                if let Some(add) = add {
                    let ar = add.row(r);
                    acc[0] = _mm512_add_ps(acc[0], _mm512_maskz_loadu_ps(m0, ar));
                    acc[1] = _mm512_add_ps(acc[1], _mm512_maskz_loadu_ps(m1, ar.add(16)));
                }
                _mm512_mask_storeu_ps(cr, m0, acc[0]);
                _mm512_mask_storeu_ps(cr.add(16), m1, acc[1]);
            }
        }
    }
}

/// dst[c · rows + r] = a[r][c] for every element of `a` (≤ 16 rows): a tile of A's rows packed
/// for [`one_tap`], each inner index's values gathered in one instruction
/// (`sgemm::Micro::pack`). Panics where `dst` is shorter than `a` or `a`'s rows are too far
/// apart for the gather's i32 offsets.
#[target_feature(enable = "avx512f")]
pub(crate) fn pack_rows(a: Mat<&[f32]>, dst: &mut [f32]) {
    let (rows, kc, rs) = (a.rows(), a.cols(), a.stride());
    assert!(rows <= 16 && dst.len() >= rows * kc && rs.checked_mul(4 * rows).is_some_and(|b| b <= i32::MAX as usize), "pack_rows: {rows} x {kc}");
    if rows == 0 || kc == 0 {
        return;
    }
    let mask: __mmask16 = ((1u32 << rows) - 1) as u16;
    let index = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(rs as i32));
    let (a, d) = (a.as_raw(), dst.as_mut_ptr());
    for c in 0..kc {
        // SAFETY: the mask's lanes r < rows gather a[r][c] (offsets r · rs within an i32,
        // asserted), an element of the view; `dst` holds rows · kc floats (asserted).
        unsafe {
            let v = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, index, a.at(0, c));
            _mm512_mask_storeu_ps(d.add(c * rows), mask, v);
        }
    }
}

/// 2^f, |f| ≤ ½, by a degree-6 polynomial (Taylor's in f ln 2, relative error < 2e-7 there,
/// well under bf16's 2^-9): the GELU's, whose f32 results are kept.
pub(crate) const POW2_FULL: [f32; 7] = [1.0, std::f32::consts::LN_2, 0.240_226_5, 0.055_504_11, 0.009_618_129, 0.001_333_355_8, 0.000_154_035_3];
/// The same by degree 4, coefficients fitted to the relative error (< 3e-6 there: a hundredth
/// of bf16's 2^-9), two multiply-adds fewer per 16 values: for softmax's probabilities, which are
/// rounded to bf16 next.
pub(crate) const POW2_SHORT: [f32; 5] = [0.999_999_2, 0.693_122, 0.240_249_75, 0.055_917_07, 0.009_560_765];

/// 2^t, t ≤ 0 (or small): t = n + f, |f| ≤ ½, 2^f by the polynomial `c` (lowest degree first,
/// [`POW2_FULL`] or [`POW2_SHORT`]), 2^n by `vscalefps`, which also takes n far below the
/// exponent range to 0 without a clamp.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn pow2<const D: usize>(t: __m512, c: &[f32; D]) -> __m512 {
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
    let f = _mm512_sub_ps(t, n);
    let mut q = _mm512_set1_ps(c[D - 1]);
    for &ci in c[..D - 1].iter().rev() {
        q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(ci));
    }
    _mm512_scalef_ps(q, n)
}

/// Exact GELU, x·Φ(x), in the form of `crate::simd::math::gelu` (erfc by Numerical Recipes'
/// t·exp(−z² + P(t)), t = 1/(1 + z/2)), with FMAs, 1/(1 + z/2) by `vrcp14ps` and a Newton step
/// (a division's throughput bounded the vectorised scalar code) and the exp by [`pow2`].
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn gelu16(x: __m512) -> __m512 {
    const P: [f32; 10] =
        [0.170_872_77, -0.822_152_23, 1.488_515_9, -1.135_204, 0.278_868_07, -0.186_288_06, 0.096_784_18, 0.374_091_96, 1.000_023_7, -1.265_512_2];
    let z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
    let d = _mm512_fmadd_ps(z, _mm512_set1_ps(0.5), _mm512_set1_ps(1.0));
    let r = _mm512_rcp14_ps(d);
    let t = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0)));
    let mut p = _mm512_set1_ps(P[0]);
    for &c in &P[1..] {
        p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(c));
    }
    // erfc(|x|/√2) = t · e^(p − z²); Φ = erfc/2 below 0, 1 − erfc/2 above. Past 2^-100 (|x|
    // above ~11.8) erfc/2 is taken as 0: the result is then x above 0, as f32's x · (1 − ε)
    // was, and −0 below, where it was a negative under 3e-30 in size. Computed, those lanes went
    // through denormals, each a microcode assist: fc1 at 1800x1024x4096 with pre-activations
    // of std ~10 took 49 ms against 6 (an Intel Xeon with AMX, 2026-12-07).
    let lim = _mm512_set1_ps(-100.0);
    let a = _mm512_mul_ps(_mm512_fnmadd_ps(z, z, p), _mm512_set1_ps(std::f32::consts::LOG2_E));
    let tail = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, lim);
    let e = _mm512_maskz_mov_ps(!tail, _mm512_mul_ps(t, pow2(_mm512_max_ps(a, lim), &POW2_FULL)));
    let half = _mm512_mul_ps(e, _mm512_set1_ps(0.5));
    let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_setzero_ps());
    let phi = _mm512_mask_blend_ps(neg, _mm512_sub_ps(_mm512_set1_ps(1.0), half), half);
    _mm512_mul_ps(x, phi)
}
