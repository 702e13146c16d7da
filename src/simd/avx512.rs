//! The AVX-512F one-tap register-tile kernel ([`one_tap`], 14 rows x 32 columns) and its tile
//! packing ([`pack_rows`]): the f32 products' kernel at the AVX-512 levels (`super::sgemm`),
//! the AVX2 kernel's arithmetic on zmm registers. The accumulator prologue (`start!`) and the
//! store masks (`masks`) are shared with the direct 3x3 convolution's AVX-512 kernels.
//!
//! # Safety
//! Call only where the CPU has AVX-512F: a `super::sgemm::Micro::Avx512` exists only there.

use core::arch::x86_64::*;

// The prologue is a macro: as a function (even `#[inline]` with the same target features) it
// was not inlined and cost 50 % of the conv time.

/// Accumulators set to the bias; the residual rows (read at the end) prefetched now, so
/// they arrive while the k loop runs.
macro_rules! start {
    ($r:ident, $bias:ident, $add:ident, $ldc:ident) => {{
        if !$add.is_null() {
            for r in 0..$r {
                let p = $add.add(r * $ldc) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(p);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
            }
        }
        let mut acc = [[_mm512_setzero_ps(); 2]; $r];
        for (r, acc) in acc.iter_mut().enumerate() {
            let b = _mm512_set1_ps(*$bias.add(r));
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

/// C[mv × nv] (mv ≤ [`ONE_TAP_ROWS`], nv ≤ 32) = bias + A · B [+ add]: the AVX2 kernel's
/// one-tap product (`super::avx2::kernel`, same packing of A: a tile's `mv` values of each
/// inner index side by side, those of the next `lda` floats on) on 32 columns of zmm
/// registers, for `super::sgemm::Micro` at the AVX-512 levels. B's `kc` rows are `cs` floats
/// apart, 32 readable in each; `add`'s rows `add_ld` apart (0: one row, a bias of columns,
/// added to every row); `pf.1` lines of 16 floats from `pf.0` requested into L2, one per inner
/// index (`sgemm::product`'s next panel).
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) unsafe fn one_tap(
    mv: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    cs: usize,
    kc: usize,
    bias: *const f32,
    add: *const f32,
    add_ld: usize,
    c: *mut f32,
    ldc: usize,
    nv: usize,
    pf: (*const f32, usize),
) {
    macro_rules! go {
        ($($r:literal)*) => {
            match mv {
                $($r => one_tap_rows::<$r>(a, lda, b, cs, kc, bias, add, add_ld, c, ldc, nv, pf),)*
                _ => unreachable!("one_tap: {mv} rows"),
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14)
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn one_tap_rows<const R: usize>(
    a: *const f32,
    lda: usize,
    b: *const f32,
    cs: usize,
    kc: usize,
    bias: *const f32,
    add: *const f32,
    add_ld: usize,
    c: *mut f32,
    ldc: usize,
    nv: usize,
    pf: (*const f32, usize),
) {
    let mut acc = start!(R, bias, add, add_ld);
    let (mut at, mut bt) = (a, b);
    // One inner index: B's row, each row of A broadcast, two FMAs each.
    macro_rules! step {
        () => {
            let b0 = _mm512_loadu_ps(bt);
            let b1 = _mm512_loadu_ps(bt.add(16));
            for (r, acc) in acc.iter_mut().enumerate() {
                let ar = _mm512_set1_ps(*at.add(r));
                acc[0] = _mm512_fmadd_ps(ar, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(ar, b1, acc[1]);
            }
            bt = bt.add(cs);
            at = at.add(lda);
        };
    }
    // `pf`'s lines requested one per inner index, in a loop of their own (no test in the rest).
    let fetch = pf.1.min(kc);
    for i in 0..fetch {
        _mm_prefetch::<_MM_HINT_T1>(pf.0.add(16 * i) as *const i8);
        step!();
    }
    for _ in fetch..kc {
        step!();
    }
    let (m0, m1) = masks(nv);
    for (r, acc) in acc.iter_mut().enumerate() {
        let cr = c.add(r * ldc);
        if nv >= 32 {
            if !add.is_null() {
                let ar = add.add(r * add_ld);
                acc[0] = _mm512_add_ps(acc[0], _mm512_loadu_ps(ar));
                acc[1] = _mm512_add_ps(acc[1], _mm512_loadu_ps(ar.add(16)));
            }
            _mm512_storeu_ps(cr, acc[0]);
            _mm512_storeu_ps(cr.add(16), acc[1]);
        } else {
            if !add.is_null() {
                let ar = add.add(r * add_ld);
                acc[0] = _mm512_add_ps(acc[0], _mm512_maskz_loadu_ps(m0, ar));
                acc[1] = _mm512_add_ps(acc[1], _mm512_maskz_loadu_ps(m1, ar.add(16)));
            }
            _mm512_mask_storeu_ps(cr, m0, acc[0]);
            _mm512_mask_storeu_ps(cr.add(16), m1, acc[1]);
        }
    }
}

/// dst[c · rows + r] = a[r · rs + c] for r < rows (≤ 16), c < kc: a tile of A's rows packed for
/// [`one_tap`], each inner index's `rows` values gathered in one instruction
/// (`sgemm::Micro::pack`).
///
/// # Safety
/// AVX-512F; `a` holds `rows` rows of `kc` floats `rs` apart, with `rows · rs · 4` bytes within
/// an i32; `dst` `rows · kc` writable floats.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn pack_rows(rows: usize, a: *const f32, rs: usize, kc: usize, dst: *mut f32) {
    debug_assert!(rows <= 16);
    let mask: __mmask16 = ((1u32 << rows) - 1) as u16;
    let index = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(rs as i32));
    for c in 0..kc {
        let v = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, index, a.add(c));
        _mm512_mask_storeu_ps(dst.add(c * rows), mask, v);
    }
}
