//! The direct route's kernels: AVX-512F (f32 FMA) and AVX512-BF16 (bf16 pair dot products,
//! and the pair conversion of the slab), sharing a prologue (`start!`, also the one-tap
//! kernel's, in `crate::simd::avx512`) and an epilogue.
//!
//! # Safety
//! Call the f32 kernels only on the `Isa::Avx512` direct route and the bf16 ones only on
//! `Isa::Avx512Bf16` (`super::route`), which `crate::simd::isa` gives only where the CPU has
//! them.

use core::arch::x86_64::*;

use crate::simd::avx512::{masks, start};

// The kernels' epilogue, shared as a macro: as a function (even `#[inline]` with the same
// target features) it was not inlined and cost 50 % of the conv time.

/// C rows = acc [+ residual rows], masked to the first `nv` of 32 columns.
macro_rules! store {
    ($acc:ident, $add:ident, $c:ident, $ldc:ident, $nv:ident) => {{
        let (m0, m1) = masks($nv);
        for (r, acc) in $acc.iter_mut().enumerate() {
            let cr = $c.add(r * $ldc);
            if !$add.is_null() {
                let ar = $add.add(r * $ldc);
                acc[0] = _mm512_add_ps(acc[0], _mm512_maskz_loadu_ps(m0, ar));
                acc[1] = _mm512_add_ps(acc[1], _mm512_maskz_loadu_ps(m1, ar.add(16)));
            }
            _mm512_mask_storeu_ps(cr, m0, acc[0]);
            _mm512_mask_storeu_ps(cr.add(16), m1, acc[1]);
        }
    }};
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn pairs(a: &[f32], b: &[f32], relu: bool, dst: &mut [u32]) {
    let n = dst.len().min(a.len()).min(b.len());
    let zero = _mm512_setzero_ps();
    let mut i = 0;
    while i < n {
        let m: __mmask16 = if n - i >= 16 { 0xffff } else { ((1u32 << (n - i)) - 1) as u16 };
        let mut va = _mm512_maskz_loadu_ps(m, a.as_ptr().add(i));
        let mut vb = _mm512_maskz_loadu_ps(m, b.as_ptr().add(i));
        if relu {
            va = _mm512_max_ps(va, zero);
            vb = _mm512_max_ps(vb, zero);
        }
        let lo: __m256i = core::mem::transmute(_mm512_cvtneps_pbh(va));
        let hi: __m256i = core::mem::transmute(_mm512_cvtneps_pbh(vb));
        let word = _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(hi)));
        _mm512_mask_storeu_epi32(dst.as_mut_ptr().add(i) as *mut _, m, word);
        i += 16;
    }
}

/// Dispatch on the arithmetic (bf16 pairs or f32 words in `a` and the slab) and on the
/// number of output channels in the panel.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(super) unsafe fn kernel(
    bf16: bool,
    mv: usize,
    a: *const u32,
    lda: usize,
    taps: &[*const u32; 9],
    cs: usize,
    kc: usize,
    bias: *const f32,
    add: *const f32,
    c: *mut f32,
    ldc: usize,
    nv: usize,
) {
    macro_rules! go {
        ($($r:literal)*) => {
            match mv {
                $($r => if bf16 {
                    kern::<$r>(a, lda, taps, cs, kc, bias, add, c, ldc, nv)
                } else {
                    kern_f32::<$r>(a as *const f32, lda, taps, cs, kc, bias, add, c, ldc, nv)
                },)*
                _ => unreachable!()
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12)
}

/// C[R×nv] = bias + [add +] Σ_taps Σ_pairs A · B, where tap t's B rows (one per channel
/// pair, `cs` words apart) start at taps[t]: 32 pixels of one output row, as bf16 pairs.
/// The same register tile as the GEMM microkernel (R×2 zmm accumulators, 24 chains).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn kern<const R: usize>(
    a: *const u32,
    lda: usize,
    taps: &[*const u32; 9],
    cs: usize,
    cinp: usize,
    bias: *const f32,
    add: *const f32,
    c: *mut f32,
    ldc: usize,
    nv: usize,
) {
    let mut acc = start!(R, bias, add, ldc);
    for (t, &tap) in taps.iter().enumerate() {
        let at = a.add(t * cinp);
        let mut b = tap;
        for cp in 0..cinp {
            let b0: __m512bh = core::mem::transmute(_mm512_loadu_si512(b as *const _));
            let b1: __m512bh = core::mem::transmute(_mm512_loadu_si512(b.add(16) as *const _));
            for (r, acc) in acc.iter_mut().enumerate() {
                let ar: __m512bh = core::mem::transmute(_mm512_set1_epi32(*at.add(r * lda + cp) as i32));
                acc[0] = _mm512_dpbf16_ps(acc[0], ar, b0);
                acc[1] = _mm512_dpbf16_ps(acc[1], ar, b1);
            }
            b = b.add(cs);
        }
    }
    store!(acc, add, c, ldc, nv);
}

/// [`kern`] in f32: one FMA per weight and pixel instead of a bf16 pair's dot product.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn kern_f32<const R: usize>(
    a: *const f32,
    lda: usize,
    taps: &[*const u32; 9],
    cs: usize,
    cin: usize,
    bias: *const f32,
    add: *const f32,
    c: *mut f32,
    ldc: usize,
    nv: usize,
) {
    let mut acc = start!(R, bias, add, ldc);
    for (t, &tap) in taps.iter().enumerate() {
        let at = a.add(t * cin);
        let mut b = tap as *const f32;
        for ci in 0..cin {
            let b0 = _mm512_loadu_ps(b);
            let b1 = _mm512_loadu_ps(b.add(16));
            for (r, acc) in acc.iter_mut().enumerate() {
                let ar = _mm512_set1_ps(*at.add(r * lda + ci));
                acc[0] = _mm512_fmadd_ps(ar, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(ar, b1, acc[1]);
            }
            b = b.add(cs);
        }
    }
    store!(acc, add, c, ldc, nv);
}
