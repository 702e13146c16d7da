//! The f32 register-tile kernel for AVX2 + FMA, over any number of taps: the 3x3 convolution's
//! direct route at AVX2 (nine taps, `crate::model::cpu::conv3x3`) and the one-tap products of
//! `super::sgemm::Micro::Avx2` (linears, attention, 1x1 and transposed convolutions,
//! Winograd). It does the AVX-512F kernels' arithmetic (bias, then one FMA per tap and input
//! channel in the same order, then the residual), so the routes give the same bits, on a
//! register tile that fits 16 ymm registers.
//!
//! # Safety
//! Call only at `Isa::Avx2` or above (the direct route's `Isa::Avx2`, or a `Micro::Avx2`),
//! which `super::isa` gives only where the CPU has AVX2 and FMA.

use core::arch::x86_64::*;

/// Rows (output channels) of one register tile: 6 x 2 ymm accumulators, two slab vectors and
/// a broadcast weight: 15 of the 16 registers (`sgemm::Micro::row_tiles` cuts rows in these).
pub(crate) const ROWS: usize = 6;

/// Where weight (row r of a tile of `rows` rows, tap t, channel c) sits in a tile's packed
/// block: the tile's weights for one (tap, channel) side by side, read in one stream.
#[inline(always)]
pub(crate) fn packed_index(rows: usize, cin: usize, r: usize, t: usize, c: usize) -> usize {
    (t * cin + c) * rows + r
}

/// C[mv × nv] (mv ≤ 6, nv ≤ 16) from one tile's packed weights `a` ([`packed_index`], with
/// `lda` ≥ mv for the tile's height: the rows of one (tap, channel) `lda` floats after the
/// last's) and `taps.len()` taps, plus `add`'s rows (`add_ld` apart: 0 adds one row, a bias of
/// columns, to every row). Each tap's 16 floats are read whole for every channel (`nv` masks only the
/// added rows and the stores), so they must be readable. `pf.1` lines of 16 floats from `pf.0`
/// are requested into L2 as the first tap goes, one per channel (`sgemm::product`'s next panel;
/// none for the convolutions).
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) unsafe fn kernel(
    mv: usize,
    a: *const f32,
    lda: usize,
    taps: &[*const u32],
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
                $($r => kern::<$r>(a, lda, taps, cs, kc, bias, add, add_ld, c, ldc, nv, pf),)*
                _ => unreachable!(),
            }
        };
    }
    go!(1 2 3 4 5 6)
}

/// C[R × min(nv, 16)] = bias + Σ_taps Σ_channels A · B [+ add], B rows `cs` floats apart from
/// each tap's start, `add` rows `add_ld` apart.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn kern<const R: usize>(
    a: *const f32,
    lda: usize,
    taps: &[*const u32],
    cs: usize,
    cin: usize,
    bias: *const f32,
    add: *const f32,
    add_ld: usize,
    c: *mut f32,
    ldc: usize,
    nv: usize,
    pf: (*const f32, usize),
) {
    if !add.is_null() {
        // The residual rows, read at the end, requested now.
        for r in 0..R {
            _mm_prefetch::<_MM_HINT_T0>(add.add(r * add_ld) as *const i8);
        }
    }
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for (r, acc) in acc.iter_mut().enumerate() {
        let b = _mm256_set1_ps(*bias.add(r));
        *acc = [b, b];
    }
    // One inner index: B's row, each row of A broadcast, two FMAs each.
    macro_rules! step {
        ($at:ident, $b:ident) => {
            let b0 = _mm256_loadu_ps($b);
            let b1 = _mm256_loadu_ps($b.add(8));
            for (r, acc) in acc.iter_mut().enumerate() {
                let ar = _mm256_set1_ps(*$at.add(r));
                acc[0] = _mm256_fmadd_ps(ar, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(ar, b1, acc[1]);
            }
            $b = $b.add(cs);
            $at = $at.add(lda);
        };
    }
    // `pf`'s lines requested one per inner index of the first tap, in a loop of their own (a
    // test in the one loop cost the convolutions 2-5 %).
    for (t, &tap) in taps.iter().enumerate() {
        let mut at = a.add(packed_index(lda, cin, 0, t, 0));
        let mut b = tap as *const f32;
        let fetch = if t == 0 { pf.1.min(cin) } else { 0 };
        for i in 0..fetch {
            _mm_prefetch::<_MM_HINT_T1>(pf.0.add(16 * i) as *const i8);
            step!(at, b);
        }
        for _ in fetch..cin {
            step!(at, b);
        }
    }
    if nv >= 16 {
        // A whole tile: plain loads and stores (masked ones are microcoded on AMD).
        for (r, acc) in acc.iter_mut().enumerate() {
            let cr = c.add(r * ldc);
            if !add.is_null() {
                let ar = add.add(r * add_ld);
                acc[0] = _mm256_add_ps(acc[0], _mm256_loadu_ps(ar));
                acc[1] = _mm256_add_ps(acc[1], _mm256_loadu_ps(ar.add(8)));
            }
            _mm256_storeu_ps(cr, acc[0]);
            _mm256_storeu_ps(cr.add(8), acc[1]);
        }
        return;
    }
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nv as i32), lane);
    let m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nv as i32 - 8), lane);
    for (r, acc) in acc.iter_mut().enumerate() {
        let cr = c.add(r * ldc);
        if !add.is_null() {
            let ar = add.add(r * add_ld);
            acc[0] = _mm256_add_ps(acc[0], _mm256_maskload_ps(ar, m0));
            acc[1] = _mm256_add_ps(acc[1], _mm256_maskload_ps(ar.add(8), m1));
        }
        _mm256_maskstore_ps(cr, m0, acc[0]);
        _mm256_maskstore_ps(cr.add(8), m1, acc[1]);
    }
}
