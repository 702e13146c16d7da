//! The AVX-VNNI route of the int8 products: a 6 × 16 register tile (12 ymm accumulators of i32,
//! two weight vectors and a broadcast: 15 of the 16 registers), VEX `vpdpbusd` per quad.
//!
//! Called only on `Route::AvxVnni`, which `super::route` gives only where the CPU has AVX-VNNI
//! with AVX2 and FMA (`crate::simd::isa::vnni`).

use super::Tile;
use core::arch::x86_64::*;

const MR: usize = 6;
const NR: usize = 16;

/// C (mv × nv) = the tile's product, scaled, plus the bias.
///
/// # Safety
/// The CPU has AVX-VNNI, AVX2 and FMA; `t.holds(16)`, mv ≤ 6; the tile's C is writable.
pub(super) unsafe fn kernel(t: &Tile) {
    debug_assert!(t.holds(NR) && t.c.rows() <= MR);
    macro_rules! go {
        ($($r:literal)*) => {
            // SAFETY: the caller's promise, passed on; R = mv.
            match t.c.rows() { 0 => {}, $($r => unsafe { kern::<$r>(t) },)* _ => unreachable!() }
        };
    }
    go!(1 2 3 4 5 6)
}

/// [`kernel`] for R = mv rows.
///
/// # Safety
/// As [`kernel`].
#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn kern<const R: usize>(t: &Tile) {
    let (lda, kq, nv) = (t.lda, t.kq, t.c.cols());
    let a = t.a.as_ptr();
    let mut b = t.b.as_ptr();
    let mut acc = [[_mm256_setzero_si256(); 2]; R];
    for q in 0..kq {
        // SAFETY: the panel holds kq · NR words and each of the R rows of A kq quads (`holds`).
        unsafe {
            let b0 = _mm256_loadu_si256(b as *const _);
            let b1 = _mm256_loadu_si256(b.add(8) as *const _);
            for (r, acc) in acc.iter_mut().enumerate() {
                let ar = _mm256_set1_epi32((a.add(r * lda + 4 * q) as *const i32).read_unaligned());
                acc[0] = _mm256_dpbusd_avx_epi32(acc[0], ar, b0);
                acc[1] = _mm256_dpbusd_avx_epi32(acc[1], ar, b1);
            }
        }
        b = b.wrapping_add(NR);
    }
    // y = (acc − z · Σq) · (s_a · s_w) + bias, per row.
    // SAFETY: NR scales, sums and biases are there (`holds`).
    let (cs, sw, bias) = unsafe {
        (
            [_mm256_loadu_si256(t.colsum.as_ptr() as *const _), _mm256_loadu_si256(t.colsum.as_ptr().add(8) as *const _)],
            [_mm256_loadu_ps(t.scale_b.as_ptr()), _mm256_loadu_ps(t.scale_b.as_ptr().add(8))],
            [_mm256_loadu_ps(t.bias.as_ptr()), _mm256_loadu_ps(t.bias.as_ptr().add(8))],
        )
    };
    for (r, acc) in acc.iter().enumerate() {
        let z = _mm256_set1_epi32(t.zero_a[r]);
        let s = _mm256_set1_ps(t.scale_a[r]);
        let mut row = [0f32; NR];
        for h in 0..2 {
            let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[h], _mm256_mullo_epi32(z, cs[h])));
            let y = _mm256_fmadd_ps(v, _mm256_mul_ps(s, sw[h]), bias[h]);
            // SAFETY: `row` holds NR floats.
            unsafe { _mm256_storeu_ps(row.as_mut_ptr().add(8 * h), y) };
        }
        // SAFETY: row r of C has nv ≤ NR writable columns.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), t.c.row(r), nv) };
    }
}
