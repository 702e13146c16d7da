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

/// 2^f, |f| ≤ ½, by a degree-4 polynomial fitted to the relative error (< 3e-6 there: a
/// hundredth of bf16's 2^-9): for softmax's probabilities, which are rounded to bf16 next.
pub(crate) const POW2_SHORT: [f32; 5] = [0.999_999_2, 0.693_122, 0.240_249_75, 0.055_917_07, 0.009_560_765];

/// 2^t, t ≤ 0 (or small): t = n + f, |f| ≤ ½, 2^f by the polynomial `c` (lowest degree first,
/// such as [`POW2_SHORT`]), 2^n by `vscalefps`, which also takes n far below the
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

/// Q(u) = Φ(−u) = erfc(u/√2)/2 on intervals of 0.4 from 0, lane i the interval [0.4·i, 0.4·i +
/// 0.4) (the last, u ≥ 6, is 0: Q(6) = 1e-9), row p the coefficient of t^p, t = u − 0.4·i: fits
/// through each interval's Chebyshev nodes, made by `scripts/gelu_table.py`.
const GELU_Q: [[f32; 16]; 5] = [
    [
        4.9999982e-01,
        3.445782e-01,
        2.1185547e-01,
        1.1506979e-01,
        5.4799374e-02,
        2.2750152e-02,
        8.197519e-03,
        2.555108e-03,
        6.8712333e-04,
        1.5910197e-04,
        3.1668955e-05,
        5.4119173e-06,
        7.931893e-07,
        9.961908e-08,
        1.0713819e-08,
        0.0e+00,
    ],
    [
        -3.989192e-01,
        -3.6826178e-01,
        -2.8970042e-01,
        -1.9420135e-01,
        -1.10931285e-01,
        -5.3993516e-02,
        -2.2392461e-02,
        -7.912646e-03,
        -2.3822596e-03,
        -6.11072e-04,
        -1.3354306e-04,
        -2.486374e-05,
        -3.9438446e-06,
        -5.329351e-07,
        -6.1351344e-08,
        0.0e+00,
    ],
    [
        -4.639019e-04,
        7.348011e-02,
        1.16049014e-01,
        1.1681727e-01,
        8.89483e-02,
        5.4044414e-02,
        2.683296e-02,
        1.1025376e-02,
        3.7775612e-03,
        1.0845434e-03,
        2.6179114e-04,
        5.3257267e-05,
        9.147327e-06,
        1.328295e-06,
        1.6324722e-07,
        0.0e+00,
    ],
    [
        6.977236e-02,
        5.2876174e-02,
        1.625103e-02,
        -1.6375547e-02,
        -3.0362139e-02,
        -2.7408138e-02,
        -1.7497865e-02,
        -8.627831e-03,
        -3.4063475e-03,
        -1.0971396e-03,
        -2.9149913e-04,
        -6.434874e-05,
        -1.1861199e-05,
        -1.8321673e-06,
        -2.3780532e-07,
        0.0e+00,
    ],
    [
        -9.566806e-03,
        -2.1833433e-02,
        -2.0063646e-02,
        -9.09422e-03,
        1.3533275e-03,
        5.9294184e-03,
        5.515788e-03,
        3.3293392e-03,
        1.5038501e-03,
        5.3491053e-04,
        1.5359554e-04,
        3.611556e-05,
        7.017314e-06,
        1.1336971e-06,
        1.529685e-07,
        0.0e+00,
    ],
];

/// Exact GELU, x·Φ(x), within 2e-7·|x| of the erf definition: x·Q(|x|) below 0 and x − x·Q(x)
/// above, Q from [`GELU_Q`], its interval's five coefficients picked by `vpermps` (the
/// polynomial of `crate::simd::math::gelu`'s erfc, with its reciprocal and exp, was twice the
/// operations and bounded int8's fc1 at ViT-L's shapes). Past |x| = 6 the result is x above 0
/// and −0 below, with no denormal on the way.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn gelu16(x: __m512) -> __m512 {
    let u = _mm512_abs_ps(x);
    // The interval, 15 for u ≥ 6 and for NaN (whose conversion is 0x8000_0000).
    let i = _mm512_min_epu32(_mm512_cvttps_epi32(_mm512_mul_ps(u, _mm512_set1_ps(2.5))), _mm512_set1_epi32(15));
    // u bounded so that t is finite where Q's polynomial is 0 (for u = ∞ too).
    let t = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(0.4), _mm512_min_ps(u, _mm512_set1_ps(8.0)));
    let c = |p: usize| -> __m512 {
        // SAFETY: a row of the table is 16 floats.
        _mm512_permutexvar_ps(i, unsafe { _mm512_loadu_ps(GELU_Q[p].as_ptr()) })
    };
    let mut q = c(4);
    for p in (0..4).rev() {
        q = _mm512_fmadd_ps(q, t, c(p));
    }
    let xq = _mm512_mul_ps(x, q);
    let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_setzero_ps());
    _mm512_mask_mov_ps(_mm512_sub_ps(x, xq), neg, xq)
}
