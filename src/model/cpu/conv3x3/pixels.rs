//! The int8 routes' input quantised per pixel: each pixel's channels over their own range (u8
//! with a zero point), four to a word. The VNNI kernels' quad planes (`super::int8`) and the
//! one-tap int8 tiles' slab rows (`super::tiles`) are made by it.

use crate::model::cpu::matmul::int8::{range_scale, to_u8};
use crate::simd::isa::Isa;

/// One row of pixels quantised over its channels (`rows`: each channel's values along the row,
/// ReLU'd first with `relu`): each pixel's scale and zero point into `s` and `z`, its channels'
/// u8 four to a word into `planes` (one per quad).
pub(super) fn quantise_pixels(level: Isa, rows: &[&[f32]], relu: bool, s: &mut [f32], z: &mut [i32], planes: Vec<&mut [i32]>) {
    match level {
        // SAFETY: these levels are given only where the CPU has AVX-512F with BW.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Bf16 | Isa::Amx => unsafe { quantise_pixels_avx512bw(rows, relu, s, z, planes) },
        // SAFETY: this level is given only where the CPU has AVX-512F (with AVX2 and FMA).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { quantise_pixels_avx512(rows, relu, s, z, planes) },
        // SAFETY: this level is given only where the CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { quantise_pixels_avx2(rows, relu, s, z, planes) },
        _ => quantise_pixels_body(rows, relu, s, z, planes),
    }
}

/// The body of [`quantise_pixels_avx512`] (`$bw` false) and [`quantise_pixels_avx512bw`]
/// (true), one function each, as their target features differ.
#[cfg(target_arch = "x86_64")]
macro_rules! pixels_avx512 {
    ($bw:expr, $rows:ident, $relu:ident, $s:ident, $z:ident, $planes:ident) => {{
        let (rows, relu, s, z, mut planes) = ($rows, $relu, $s, $z, $planes);
        use core::arch::x86_64::*;
        let w = s.len();
        debug_assert!(z.len() == w && rows.iter().all(|r| r.len() >= w) && planes.iter().all(|p| p.len() >= w) && planes.len() * 4 >= rows.len());
        let zero = _mm512_setzero_ps();
        let (one, top) = (_mm512_set1_ps(1.0), _mm512_set1_ps(255.0));
        // `to_u8`: rounded to nearest even (for |v · inv| < 2²², as `round_even`; beyond, both clamp
        // alike), plus z, then `t >= 0 ? t : 0` (NaN to 0: `max_ps` returns its second operand on
        // NaN) and `t <= 255 ? t : 255`.
        let to_u8 = |v: __m512, inv: __m512, zf: __m512| {
            let t = _mm512_add_ps(_mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(v, inv)), zf);
            _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(t, zero), top))
        };
        for x0 in (0..w).step_by(16) {
            let m: __mmask16 = if w - x0 >= 16 { 0xffff } else { ((1u32 << (w - x0)) - 1) as u16 };
            // The lanes of `m` lie within the first w values of each row, plane, s and z (the
            // promise of the debug assertion above); masked-off lanes are not touched.
            // SAFETY: as said.
            let load = |r: &[f32]| unsafe { _mm512_maskz_loadu_ps(m, r.as_ptr().add(x0)) };
            // As the body: `if v < lo { v } else { lo }` is `min_ps(v, lo)`, NaN kept out; after a
            // ReLU (`if v < 0 { 0 } else { v }`, `max_ps(0, v)`) the minimum is 0 and the maximum is
            // the plain one's.
            let (mut lo, mut hi) = (zero, zero);
            for r in rows {
                let v = load(r);
                if !relu {
                    lo = _mm512_min_ps(v, lo);
                }
                hi = _mm512_max_ps(v, hi);
            }
            // `range_scale`, lane-wise.
            let sc = _mm512_div_ps(_mm512_sub_ps(hi, lo), top);
            let ok = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(sc, zero) & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(sc, _mm512_set1_ps(f32::INFINITY));
            let sc = _mm512_mask_blend_ps(ok, one, sc);
            let inv = _mm512_div_ps(one, sc);
            let zi = to_u8(_mm512_sub_ps(zero, lo), inv, zero);
            let zf = _mm512_cvtepi32_ps(zi);
            // SAFETY: the lanes of `m` (above).
            unsafe {
                _mm512_mask_storeu_ps(s.as_mut_ptr().add(x0), m, sc);
                _mm512_mask_storeu_epi32(z.as_mut_ptr().add(x0), m, zi);
            }
            if $bw {
                let (top, zq) = (_mm512_set1_ps(256.0), zi);
                for (quad, plane) in planes.iter_mut().enumerate() {
                    // A channel past cin keeps its byte 0 (its weights are 0): a zero lane.
                    let q = [0, 1, 2, 3].map(|j| match rows.get(4 * quad + j) {
                        Some(r) => _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_min_ps(top, _mm512_mul_ps(load(r), inv))), zq),
                        None => _mm512_setzero_si512(),
                    });
                    // SAFETY: the lanes of `m` (above).
                    unsafe { _mm512_mask_storeu_epi32(plane.as_mut_ptr().add(x0), m, super::avx512::words4(q)) };
                }
                continue;
            }
            for (quad, plane) in planes.iter_mut().enumerate() {
                let mut word = _mm512_setzero_si512();
                // A channel past cin keeps its byte 0 (its weights are 0).
                for (j, r) in rows.iter().enumerate().skip(4 * quad).take(4) {
                    let v = if relu { _mm512_max_ps(zero, load(r)) } else { load(r) };
                    word = _mm512_or_si512(word, _mm512_sllv_epi32(to_u8(v, inv, zf), _mm512_set1_epi32(8 * (j - 4 * quad) as i32)));
                }
                // SAFETY: the lanes of `m` (above).
                unsafe { _mm512_mask_storeu_epi32(plane.as_mut_ptr().add(x0), m, word) };
            }
        }
    }};
}

/// [`quantise_pixels`] on AVX-512F registers, 16 pixels at a time: the same values as
/// [`quantise_pixels_body`] (each step as `to_u8` and `range_scale` take it, NaN included),
/// which the compiler left scalar where it packs the bytes.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn quantise_pixels_avx512(rows: &[&[f32]], relu: bool, s: &mut [f32], z: &mut [i32], planes: Vec<&mut [i32]>) {
    pixels_avx512!(false, rows, relu, s, z, planes)
}

/// [`quantise_pixels_avx512`] with AVX512-BW's saturating packs for the bytes
/// (`super::avx512::words4`, as the int8 tiles' 3x3 slab): the same bytes, `to_u8`'s rounding
/// by `cvtps2dq`'s nearest-even and its clamp by the packs' saturation (v · inv held below 256
/// first; a NaN, `minps`'s second operand, passes to `cvtps2dq`'s i32::MIN, hence 0).
///
/// # Safety
/// The CPU has AVX-512F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantise_pixels_avx512bw(rows: &[&[f32]], relu: bool, s: &mut [f32], z: &mut [i32], planes: Vec<&mut [i32]>) {
    pixels_avx512!(true, rows, relu, s, z, planes)
}

/// [`quantise_pixels_avx512`] on AVX2 registers, 8 pixels at a time (the AVX-VNNI route's, and
/// the emulated route's at this level): the same values as [`quantise_pixels_body`].
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantise_pixels_avx2(rows: &[&[f32]], relu: bool, s: &mut [f32], z: &mut [i32], mut planes: Vec<&mut [i32]>) {
    use core::arch::x86_64::*;
    let w = s.len();
    debug_assert!(z.len() == w && rows.iter().all(|r| r.len() >= w) && planes.iter().all(|p| p.len() >= w) && planes.len() * 4 >= rows.len());
    let zero = _mm256_setzero_ps();
    let (one, top) = (_mm256_set1_ps(1.0), _mm256_set1_ps(255.0));
    // As the AVX-512 form's (`vmaxps` / `vminps` return their second operand on NaN).
    let to_u8 = |v: __m256, inv: __m256, zf: __m256| {
        let t = _mm256_add_ps(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v, inv)), zf);
        _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(t, zero), top))
    };
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for x0 in (0..w).step_by(8) {
        // Lane i is live where i < w - x0 (all ones), for the masked loads and stores.
        let m = _mm256_cmpgt_epi32(_mm256_set1_epi32((w - x0).min(8) as i32), lanes);
        // The live lanes lie within the first w values of each row, plane, s and z (the promise
        // of the debug assertion above); the others are not touched.
        // SAFETY: as said.
        let load = |r: &[f32]| unsafe { _mm256_maskload_ps(r.as_ptr().add(x0), m) };
        let (mut lo, mut hi) = (zero, zero);
        for r in rows {
            let v = load(r);
            if !relu {
                lo = _mm256_min_ps(v, lo);
            }
            hi = _mm256_max_ps(v, hi);
        }
        let sc = _mm256_div_ps(_mm256_sub_ps(hi, lo), top);
        let ok = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(sc, zero), _mm256_cmp_ps::<_CMP_LT_OQ>(sc, _mm256_set1_ps(f32::INFINITY)));
        let sc = _mm256_blendv_ps(one, sc, ok);
        let inv = _mm256_div_ps(one, sc);
        let zi = to_u8(_mm256_sub_ps(zero, lo), inv, zero);
        let zf = _mm256_cvtepi32_ps(zi);
        // SAFETY: the live lanes (above).
        unsafe {
            _mm256_maskstore_ps(s.as_mut_ptr().add(x0), m, sc);
            _mm256_maskstore_epi32(z.as_mut_ptr().add(x0), m, zi);
        }
        for (quad, plane) in planes.iter_mut().enumerate() {
            let mut word = _mm256_setzero_si256();
            for (j, r) in rows.iter().enumerate().skip(4 * quad).take(4) {
                let v = if relu { _mm256_max_ps(zero, load(r)) } else { load(r) };
                word = _mm256_or_si256(word, _mm256_sllv_epi32(to_u8(v, inv, zf), _mm256_set1_epi32(8 * (j - 4 * quad) as i32)));
            }
            // SAFETY: the live lanes (above).
            unsafe { _mm256_maskstore_epi32(plane.as_mut_ptr().add(x0), m, word) };
        }
    }
}

/// Every loop here runs along the row, so that it vectorises over pixels (the channels of a
/// pixel are a plane apart).
#[inline(always)]
fn quantise_pixels_body(rows: &[&[f32]], relu: bool, s: &mut [f32], z: &mut [i32], planes: Vec<&mut [i32]>) {
    let w = s.len();
    // The ReLU as a floor under the values (−∞: none).
    let floor = if relu { 0.0 } else { f32::NEG_INFINITY };
    let (mut lo, mut hi) = (vec![0f32; w], vec![0f32; w]);
    for row in rows {
        for ((l, h), &v) in lo.iter_mut().zip(hi.iter_mut()).zip(&row[..w]) {
            let v = if v < floor { floor } else { v };
            *l = if v < *l { v } else { *l };
            *h = if v > *h { v } else { *h };
        }
    }
    let (mut inv, mut zf) = (vec![0f32; w], vec![0f32; w]);
    for ((((s, z), (inv, zf)), &l), &h) in s.iter_mut().zip(z.iter_mut()).zip(inv.iter_mut().zip(zf.iter_mut())).zip(&lo).zip(&hi) {
        (*s, *inv, *z) = range_scale(l, h);
        *zf = *z as f32;
    }
    let zeros = vec![0f32; w];
    for (quad, plane) in planes.into_iter().enumerate() {
        let r = |j: usize| rows.get(4 * quad + j).map_or(&zeros[..], |r| &r[..w]);
        // A channel past cin is 0 (its weights are 0): its byte is left 0 too.
        let live = |j: usize| 4 * quad + j < rows.len();
        let (r0, r1, r2, r3) = (r(0), r(1), r(2), r(3));
        let masks = [0, 1, 2, 3].map(|j| if live(j) { 0xff } else { 0 });
        for i in 0..w {
            let q = |v: f32, m: i32| {
                let v = if v < floor { floor } else { v };
                to_u8(v, inv[i], zf[i]) & m
            };
            plane[i] = q(r0[i], masks[0]) | q(r1[i], masks[1]) << 8 | q(r2[i], masks[2]) << 16 | q(r3[i], masks[3]) << 24;
        }
    }
}
