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
    if src.is_empty() {
        return;
    }
    let (sp, len) = (src.as_ptr(), src.len());
    let (p0, p1, q0, q1, op) = (x0.as_ptr(), x1.as_ptr(), w0.as_ptr(), w1.as_ptr(), out.as_mut_ptr());
    // SAFETY (the pointer reads and writes below): i + 8 <= n, which no slice is shorter than,
    // and the source's eight floats from `base` are inside it (checked before the load).
    let high = _mm256_set1_epi32(!7);
    let mut i = 0;
    while i + 8 <= n {
        // Relative to the block's first index, every tap must be in 0..8 (unsigned: one below
        // it wraps to a large value), and the eight floats from there inside the row.
        let base = *p0.add(i) as usize;
        let b = _mm256_set1_epi32(base as i32);
        let d0 = _mm256_sub_epi32(_mm256_loadu_si256(p0.add(i) as *const __m256i), b);
        let d1 = _mm256_sub_epi32(_mm256_loadu_si256(p1.add(i) as *const __m256i), b);
        if _mm256_testz_si256(_mm256_or_si256(d0, d1), high) == 1 && base + 8 <= len {
            let v = _mm256_loadu_ps(sp.add(base));
            let a = _mm256_permutevar8x32_ps(v, d0);
            let c = _mm256_permutevar8x32_ps(v, d1);
            let r = _mm256_add_ps(_mm256_mul_ps(a, _mm256_loadu_ps(q0.add(i))), _mm256_mul_ps(c, _mm256_loadu_ps(q1.add(i))));
            _mm256_storeu_ps(op.add(i), r);
        } else {
            scalar(src, x0, x1, w0, w1, out, i..i + 8);
        }
        i += 8;
    }
    scalar(src, x0, x1, w0, w1, out, i..n);
}

/// The portable loop's arithmetic over `range` (blocks the permutes cannot take, the tail).
#[cold]
#[inline(never)]
fn scalar(src: &[f32], x0: &[u32], x1: &[u32], w0: &[f32], w1: &[f32], out: &mut [f32], range: std::ops::Range<usize>) {
    let last = src.len() - 1;
    for i in range {
        let (a, b) = ((x0[i] as usize).min(last), (x1[i] as usize).min(last));
        out[i] = src[a] * w0[i] + src[b] * w1[i];
    }
}
