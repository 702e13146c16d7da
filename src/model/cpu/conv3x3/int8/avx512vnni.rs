//! The AVX512-VNNI kernel of the int8 convolution (`super`): a tile of 6 output channels × 32
//! pixels, 12 zmm accumulators of i32 per tap and 12 of f32 across taps.
//!
//! Called only on `Route::Avx512Vnni`, which `crate::model::cpu::matmul::int8::route` gives only where the CPU has
//! AVX512-VNNI with BW and VL (`crate::simd::isa::vnni`).

use super::ConvTile;
use core::arch::x86_64::*;

/// One tile of the int8 convolution (`super`): [`super::TILE_CH`] output channels × 32 pixels
/// of one output row, the taps' products (nine, or the centre alone) summed in i32 per tap and
/// scaled into f32 accumulators, then the bias and the residual; `t.rows` channels and `t.cols`
/// pixels kept.
///
/// # Safety
/// The CPU has AVX512-VNNI, BW and VL; `t.holds()`; the tile's outputs (rows `t.hw` apart from
/// `t.out`, `t.cols` each) are writable.
pub(super) unsafe fn conv_kernel(t: &ConvTile) {
    debug_assert!(t.holds());
    // SAFETY: the caller's promise, passed on.
    unsafe {
        if t.planes.zero_free {
            conv_kern::<false>(t)
        } else {
            conv_kern::<true>(t)
        }
    }
}

/// [`conv_kernel`], with the zero points' correction where `ZERO` (some pixel's zero point is
/// not 0; after a ReLU none is, and the correction is skipped).
///
/// # Safety
/// As [`conv_kernel`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn conv_kern<const ZERO: bool>(t: &ConvTile) {
    use super::TILE_CH as R;
    let p = t.planes;
    let (plane, quads) = (p.plane, t.quads);
    // Σ_t s[p+t] · (Σ_c u·q − z[p+t] · Σ_c q) per channel and pixel; s_w applies at the end.
    let mut accf = [[_mm512_setzero_ps(); 2]; R];
    let taps = t.offsets.len();
    for (tap, &off) in t.offsets.iter().enumerate() {
        let at = t.base + off;
        let mut acc = [[_mm512_setzero_si512(); 2]; R];
        let mut a = p.data.as_ptr().wrapping_add(at);
        let mut wq = t.weights.as_ptr().wrapping_add(tap * quads * R);
        for _ in 0..quads {
            // SAFETY: 32 words from `at` in each plane and R words per quad of this tap's
            // weights are inside (`holds`).
            unsafe {
                let a0 = _mm512_loadu_si512(a as *const _);
                let a1 = _mm512_loadu_si512(a.add(16) as *const _);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_epi32(*wq.add(r));
                    acc[0] = _mm512_dpbusd_epi32(acc[0], a0, wv);
                    acc[1] = _mm512_dpbusd_epi32(acc[1], a1, wv);
                }
            }
            a = a.wrapping_add(plane);
            wq = wq.wrapping_add(R);
        }
        // SAFETY: 32 scales (and scales · zero points) from `at` are inside (`holds`).
        let (s, sz) = unsafe {
            (
                [_mm512_loadu_ps(p.scale.as_ptr().add(at)), _mm512_loadu_ps(p.scale.as_ptr().add(at + 16))],
                [_mm512_loadu_ps(p.scale_zero.as_ptr().add(at)), _mm512_loadu_ps(p.scale_zero.as_ptr().add(at + 16))],
            )
        };
        // Unrolled by hand: a loop over r here (indexing the accumulators at run time) kept
        // them on the stack through the quad loop above, storing them on every quad.
        macro_rules! scale_in {
            ($($r:literal)*) => {$(
                for h in 0..2 {
                    accf[$r][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[$r][h]), s[h], accf[$r][h]);
                }
                if ZERO {
                    let corr = _mm512_set1_ps(t.sums[$r * taps + tap]);
                    for h in 0..2 {
                        accf[$r][h] = _mm512_fnmadd_ps(sz[h], corr, accf[$r][h]);
                    }
                }
            )*};
        }
        const { assert!(R == 6) };
        scale_in!(0 1 2 3 4 5);
    }
    let nv = t.cols;
    let (m0, m1) = crate::simd::avx512::masks(nv);
    macro_rules! store {
        ($($r:literal)*) => {$(
            if $r < t.rows {
                let (sw, b) = (_mm512_set1_ps(t.scale_w[$r]), _mm512_set1_ps(t.bias[$r]));
                let out = t.out.wrapping_add($r * t.hw);
                for (h, m) in [m0, m1].into_iter().enumerate() {
                    let mut y = _mm512_fmadd_ps(accf[$r][h], sw, b);
                    if let Some(res) = t.residual {
                        // SAFETY: the residual holds the tile's pixels of each of its rows
                        // (`holds`); masked-off lanes are not read.
                        y = _mm512_add_ps(y, unsafe { _mm512_maskz_loadu_ps(m, res.as_ptr().wrapping_add($r * t.hw + 16 * h)) });
                    }
                    // SAFETY: the tile's nv pixels of row r are writable (the caller's promise).
                    unsafe { _mm512_mask_storeu_ps(out.wrapping_add(16 * h), m, y) };
                }
            }
        )*};
    }
    store!(0 1 2 3 4 5);
}
