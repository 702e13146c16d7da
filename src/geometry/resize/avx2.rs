//! The resizes' AVX2 routes.
//!
//! `lerp_taps`: where eight consecutive output columns read source values within
//! eight consecutive floats (an upsampling, as the post-processing's is), one load and two
//! in-register permutes (`vpermps`) fetch their taps instead of two gathers, which AMD's cores
//! run many times slower. The arithmetic is the portable loop's (a·wa + b·wb, two products and
//! a sum, no FMA), so the bits are the same; other blocks take that loop.
//!
//! `rows_to_lanes` / `lanes_to_rows`: eight rows as columns of eight lanes and back, by 8x8
//! transposes in registers (the antialiased downscale's x pass works on such columns).
//!
//! # Safety
//! Call only where the CPU has AVX2 and FMA (`Isa::Avx2` and above).

use core::arch::x86_64::*;

/// out[i] = src[x0[i]]·w0[i] + src[x1[i]]·w1[i] (indices clamped to the row, as the portable
/// loop does).
///
/// # Safety
/// The CPU must have AVX2 and FMA. Every read and write stays inside the slices, whatever they
/// hold.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn lerp_taps(src: &[f32], x0: &[u32], x1: &[u32], w0: &[f32], w1: &[f32], out: &mut [f32]) {
    let n = out.len().min(x0.len()).min(x1.len()).min(w0.len()).min(w1.len());
    if src.is_empty() {
        return;
    }
    let (sp, len) = (src.as_ptr(), src.len());
    let (p0, p1, q0, q1, op) = (x0.as_ptr(), x1.as_ptr(), w0.as_ptr(), w1.as_ptr(), out.as_mut_ptr());
    let high = _mm256_set1_epi32(!7);
    let mut i = 0;
    while i + 8 <= n {
        // Relative to the block's first index, every tap must be in 0..8 (unsigned: one below
        // it wraps to a large value), and the eight floats from there inside the row.
        // SAFETY: i + 8 <= n, and no slice of the indices is shorter than n.
        let (base, d0, d1) = unsafe { (*p0.add(i) as usize, _mm256_loadu_si256(p0.add(i) as *const __m256i), _mm256_loadu_si256(p1.add(i) as *const __m256i)) };
        let b = _mm256_set1_epi32(base as i32);
        let (d0, d1) = (_mm256_sub_epi32(d0, b), _mm256_sub_epi32(d1, b));
        if _mm256_testz_si256(_mm256_or_si256(d0, d1), high) == 1 && base + 8 <= len {
            // SAFETY: base + 8 <= src.len() (checked just above); i + 8 <= n, and neither the
            // weights nor `out` are shorter than n.
            unsafe {
                let v = _mm256_loadu_ps(sp.add(base));
                let a = _mm256_permutevar8x32_ps(v, d0);
                let c = _mm256_permutevar8x32_ps(v, d1);
                let r = _mm256_add_ps(_mm256_mul_ps(a, _mm256_loadu_ps(q0.add(i))), _mm256_mul_ps(c, _mm256_loadu_ps(q1.add(i))));
                _mm256_storeu_ps(op.add(i), r);
            }
        } else {
            super::lerp_scalar(src, x0, x1, w0, w1, out, i..i + 8);
        }
        i += 8;
    }
    super::lerp_scalar(src, x0, x1, w0, w1, out, i..n);
}

/// The 8x8 transpose of eight vectors (row r of the result holds lane r of each input).
///
/// # Safety
/// The CPU must have AVX (as the AVX2 functions below, its callers, require).
#[inline(always)]
unsafe fn transpose8(v: [__m256; 8]) -> [__m256; 8] {
    // SAFETY: the CPU has AVX (this function's contract); the intrinsics only move lanes
    // between registers.
    unsafe {
        let t0 = _mm256_unpacklo_ps(v[0], v[1]);
        let t1 = _mm256_unpackhi_ps(v[0], v[1]);
        let t2 = _mm256_unpacklo_ps(v[2], v[3]);
        let t3 = _mm256_unpackhi_ps(v[2], v[3]);
        let t4 = _mm256_unpacklo_ps(v[4], v[5]);
        let t5 = _mm256_unpackhi_ps(v[4], v[5]);
        let t6 = _mm256_unpacklo_ps(v[6], v[7]);
        let t7 = _mm256_unpackhi_ps(v[6], v[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ]
    }
}

/// `lanes[x * 8 + r] = rows[r][x]` for whole blocks of 8 columns below the shortest row (and
/// `lanes`' length / 8): returns the columns done (the caller's portable loop does the rest).
///
/// # Safety
/// The CPU must have AVX2 and FMA. Every read and write stays inside the slices, whatever their
/// lengths.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows_to_lanes(rows: &[&[f32]; 8], lanes: &mut [f32]) -> usize {
    let w = rows.iter().map(|r| r.len()).min().unwrap_or(0).min(lanes.len() / 8);
    let lp = lanes.as_mut_ptr();
    let mut x = 0;
    while x + 8 <= w {
        // SAFETY: the CPU has AVX2 (this function's contract); x + 8 <= w, which no row is
        // shorter than, and 8 * w <= lanes.len().
        unsafe {
            let v = transpose8(std::array::from_fn(|r| _mm256_loadu_ps(rows[r].as_ptr().add(x))));
            for (j, v) in v.into_iter().enumerate() {
                _mm256_storeu_ps(lp.add((x + j) * 8), v);
            }
        }
        x += 8;
    }
    x
}

/// `ring[at[r] + i] = lanes[i * 8 + r]` for whole blocks of 8 values of i in 0..ow: returns
/// the values done (the caller's portable loop does the rest).
///
/// # Safety
/// The CPU must have AVX2 and FMA, and every `at[r] + ow <= ring.len()`, `8 * ow <= lanes.len()`
/// (the caller asserts it).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn lanes_to_rows(lanes: &[f32], ring: &mut [f32], ow: usize, at: &[usize]) -> usize {
    let at: &[usize; 8] = at.try_into().expect("eight rows");
    let (lp, rp) = (lanes.as_ptr(), ring.as_mut_ptr());
    let mut i = 0;
    while i + 8 <= ow {
        // SAFETY: the CPU has AVX2, every row `at[r]..at[r] + ow` is inside `ring` and 8 * ow <=
        // lanes.len() (this function's contract), and i + 8 <= ow.
        unsafe {
            let v = transpose8(std::array::from_fn(|j| _mm256_loadu_ps(lp.add((i + j) * 8))));
            for (r, v) in v.into_iter().enumerate() {
                _mm256_storeu_ps(rp.add(at[r] + i), v);
            }
        }
        i += 8;
    }
    i
}
