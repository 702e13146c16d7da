//! The AVX512-VNNI route of the int8 products: a 12 × 32 register tile (24 zmm accumulators of
//! i32, two weight vectors and a broadcast: 27 of the 32 registers), `vpdpbusd` per quad.
//!
//! Called only on `Route::Avx512Vnni`, which `super::route` gives only where the CPU has
//! AVX512-VNNI with BW and VL (`crate::simd::isa::vnni`).

use super::Tile;
use core::arch::x86_64::*;

const MR: usize = 12;
const NR: usize = 32;

/// C (mv × nv) = the tile's product, scaled, plus the bias.
///
/// # Safety
/// The CPU has AVX512-VNNI, BW and VL; `t.holds(32)`, mv ≤ 12; the tile's C is writable.
pub(super) unsafe fn kernel(t: &Tile) {
    debug_assert!(t.holds(NR) && t.c.rows() <= MR);
    macro_rules! go {
        ($($r:literal)*) => {
            // SAFETY: the caller's promise, passed on; R = mv.
            match t.c.rows() { 0 => {}, $($r => unsafe { kern::<$r>(t) },)* _ => unreachable!() }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12)
}

/// [`kernel`] for R = mv rows.
///
/// # Safety
/// As [`kernel`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn kern<const R: usize>(t: &Tile) {
    let (lda, kq, nv) = (t.lda, t.kq, t.c.cols());
    let a = t.a.as_ptr();
    let mut b = t.b.as_ptr();
    let mut acc = [[_mm512_setzero_si512(); 2]; R];
    for q in 0..kq {
        // SAFETY: the panel holds kq · NR words and each of the R rows of A kq quads (`holds`).
        unsafe {
            let b0 = _mm512_loadu_si512(b as *const _);
            let b1 = _mm512_loadu_si512(b.add(16) as *const _);
            for (r, acc) in acc.iter_mut().enumerate() {
                let ar = _mm512_set1_epi32((a.add(r * lda + 4 * q) as *const i32).read_unaligned());
                acc[0] = _mm512_dpbusd_epi32(acc[0], ar, b0);
                acc[1] = _mm512_dpbusd_epi32(acc[1], ar, b1);
            }
        }
        b = b.wrapping_add(NR);
    }
    // y = (acc − z · Σq) · (s_a · s_w) + bias, per row.
    // SAFETY: NR scales, sums and biases are there (`holds`).
    let (cs, sw, bias) = unsafe {
        (
            [_mm512_loadu_si512(t.colsum.as_ptr() as *const _), _mm512_loadu_si512(t.colsum.as_ptr().add(16) as *const _)],
            [_mm512_loadu_ps(t.scale_b.as_ptr()), _mm512_loadu_ps(t.scale_b.as_ptr().add(16))],
            [_mm512_loadu_ps(t.bias.as_ptr()), _mm512_loadu_ps(t.bias.as_ptr().add(16))],
        )
    };
    let (m0, m1) = crate::simd::avx512::masks(nv);
    for (r, acc) in acc.iter().enumerate() {
        let z = _mm512_set1_epi32(t.zero_a[r]);
        let s = _mm512_set1_ps(t.scale_a[r]);
        let cr = t.c.row(r);
        for h in 0..2 {
            let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[h], _mm512_mullo_epi32(z, cs[h])));
            let y = _mm512_fmadd_ps(v, _mm512_mul_ps(s, sw[h]), bias[h]);
            // SAFETY: the masks cover the first nv of row r's columns, which C holds.
            unsafe { _mm512_mask_storeu_ps(cr.wrapping_add(16 * h), if h == 0 { m0 } else { m1 }, y) };
        }
    }
}
