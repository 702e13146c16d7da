//! `lerp_taps` for AVX2: where eight consecutive output columns read source values within
//! eight consecutive floats (an upsampling, as the post-processing's is), one load and two
//! in-register permutes (`vpermps`) fetch their taps instead of two gathers, which AMD's cores
//! run many times slower. The arithmetic is the portable loop's (a·wa + b·wb, two products and
//! a sum, no FMA), so the bits are the same; other blocks take that loop.
//!
//! # Safety
//! Call only where the CPU has AVX2 (`Isa::Avx2` and above).

use core::arch::x86_64::*;

/// out[i] = src[x0[i]]·w0[i] + src[x1[i]]·w1[i] (indices clamped to the row, as the portable
/// loop does).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn lerp_taps(src: &[f32], x0: &[u32], x1: &[u32], w0: &[f32], w1: &[f32], out: &mut [f32]) {
    let n = out.len().min(x0.len()).min(x1.len()).min(w0.len()).min(w1.len());
    let Some(last) = src.len().checked_sub(1) else { return };
    let last = u32::try_from(last).expect("a row of fewer than 2^32 pixels");
    let one = |i: usize| {
        let (a, b) = (x0[i].min(last) as usize, x1[i].min(last) as usize);
        src[a] * w0[i] + src[b] * w1[i]
    };
    let mut i = 0;
    while i + 8 <= n {
        let idx0 = _mm256_loadu_si256(x0.as_ptr().add(i) as *const __m256i);
        let idx1 = _mm256_loadu_si256(x1.as_ptr().add(i) as *const __m256i);
        // Relative to the block's first index, every tap must be in 0..8 (unsigned: one below
        // it wraps to a large value), and the eight floats from there inside the row.
        let base = x0[i] as usize;
        let b = _mm256_set1_epi32(base as i32);
        let (d0, d1) = (_mm256_sub_epi32(idx0, b), _mm256_sub_epi32(idx1, b));
        let outside = _mm256_or_si256(d0, d1);
        if _mm256_testz_si256(outside, _mm256_set1_epi32(!7)) == 1 && base + 8 <= src.len() {
            let v = _mm256_loadu_ps(src.as_ptr().add(base));
            let a = _mm256_permutevar8x32_ps(v, d0);
            let c = _mm256_permutevar8x32_ps(v, d1);
            let wa = _mm256_loadu_ps(w0.as_ptr().add(i));
            let wb = _mm256_loadu_ps(w1.as_ptr().add(i));
            let r = _mm256_add_ps(_mm256_mul_ps(a, wa), _mm256_mul_ps(c, wb));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), r);
        } else {
            for j in i..i + 8 {
                out[j] = one(j);
            }
        }
        i += 8;
    }
    for j in i..n {
        out[j] = one(j);
    }
}
