//! The AVX-VNNI kernel of the int8 convolution (`super`), for the CPUs with VEX `vpdpbusd` on
//! ymm registers and no AVX-512 (Intel client parts): a tile of 6 output channels × 16 pixels,
//! 12 ymm accumulators of i32 per tap (with the two pixel vectors and a broadcast weight: 15 of
//! the 16 registers); the f32 sums across taps live in a small array in L1 instead, read and
//! written once per tap, against 12 · ⌈cin/4⌉ `vpdpbusd` of the tile per tap.
//!
//! Called only on `Route::AvxVnni`, which `crate::model::cpu::matmul::int8::route` gives only where the CPU has AVX-VNNI
//! with AVX2 and FMA (`crate::simd::isa::vnni`).

use super::ConvTile;
use core::arch::x86_64::*;

/// Pixels per tile: two ymm of 8.
pub(super) const TILE_PX: usize = 16;

/// One tile of the int8 convolution (`super`): [`super::TILE_CH`] output channels × 16 pixels
/// of one output row, as the AVX512-VNNI kernel's (`super::avx512vnni`); `t.rows` channels and
/// `t.cols` (≤ 16) pixels kept.
///
/// # Safety
/// The CPU has AVX-VNNI, AVX2 and FMA; `t.holds()`, `t.cols` ≤ 16; the tile's outputs (rows
/// `t.hw` apart from `t.out`, `t.cols` each) are writable.
pub(super) unsafe fn conv_kernel(t: &ConvTile) {
    debug_assert!(t.holds() && t.cols <= TILE_PX);
    // SAFETY: the caller's promise, passed on.
    unsafe {
        if t.planes.zero_free {
            conv_kern::<false>(t)
        } else {
            conv_kern::<true>(t)
        }
    }
}

/// [`conv_kernel`], with the zero points' correction where `ZERO`.
///
/// # Safety
/// As [`conv_kernel`].
#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn conv_kern<const ZERO: bool>(t: &ConvTile) {
    use super::TILE_CH as R;
    let p = t.planes;
    let (plane, quads) = (p.plane, t.quads);
    // Σ_t s[p+t] · (Σ_c u·q − z[p+t] · Σ_c q) per channel and pixel; s_w applies at the end.
    let mut accf = [[0f32; TILE_PX]; R];
    let taps = t.offsets.len();
    for (tap, &off) in t.offsets.iter().enumerate() {
        let at = t.base + off;
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        let mut a = p.data.as_ptr().wrapping_add(at);
        let mut wq = t.weights.as_ptr().wrapping_add(tap * quads * R);
        for _ in 0..quads {
            // SAFETY: 16 words from `at` in each plane and R words per quad of this tap's
            // weights are inside (`holds`).
            unsafe {
                let a0 = _mm256_loadu_si256(a as *const _);
                let a1 = _mm256_loadu_si256(a.add(8) as *const _);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let wv = _mm256_set1_epi32(*wq.add(r));
                    acc[0] = _mm256_dpbusd_avx_epi32(acc[0], a0, wv);
                    acc[1] = _mm256_dpbusd_avx_epi32(acc[1], a1, wv);
                }
            }
            a = a.wrapping_add(plane);
            wq = wq.wrapping_add(R);
        }
        // SAFETY: 16 scales (and scales · zero points) from `at` are inside (`holds`).
        let (s, sz) = unsafe {
            (
                [_mm256_loadu_ps(p.scale.as_ptr().add(at)), _mm256_loadu_ps(p.scale.as_ptr().add(at + 8))],
                [_mm256_loadu_ps(p.scale_zero.as_ptr().add(at)), _mm256_loadu_ps(p.scale_zero.as_ptr().add(at + 8))],
            )
        };
        for (r, (acc, accf)) in acc.iter().zip(accf.iter_mut()).enumerate() {
            let corr = _mm256_set1_ps(t.sums[r * taps + tap]);
            for h in 0..2 {
                // SAFETY: `accf` rows hold 16 floats.
                unsafe {
                    let f = accf.as_mut_ptr().add(8 * h);
                    let mut v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h]), s[h], _mm256_loadu_ps(f));
                    if ZERO {
                        v = _mm256_fnmadd_ps(sz[h], corr, v);
                    }
                    _mm256_storeu_ps(f, v);
                }
            }
        }
    }
    let nv = t.cols;
    for (r, accf) in accf.iter().enumerate().take(t.rows) {
        let (sw, b) = (t.scale_w[r], t.bias[r]);
        let out = t.out.wrapping_add(r * t.hw);
        let res = t.residual.map(|res| &res[r * t.hw..][..nv]);
        for (i, &v) in accf.iter().enumerate().take(nv) {
            // As the AVX512-VNNI kernel: the residual added after the fused scale and bias.
            let y = v.mul_add(sw, b);
            let y = res.map_or(y, |res| y + res[i]);
            // SAFETY: the tile's nv pixels of row r are writable (the caller's promise).
            unsafe { out.add(i).write(y) };
        }
    }
}
