//! The 8-bit codes of unit normals that the normal PNG stores: made by the post-processing
//! in place of the float map when only the PNG is wanted, and by the PNG writer otherwise.

use crate::simd::isa;

/// `round((n + 1) / 2 · 255)` per component (half away from zero, as `f32::round`, through a
/// truncating conversion that vectorises); masked normals are zero vectors → 128.
pub fn encode_normal(n: &[f32]) -> Vec<u8> {
    normal_codes(isa::current(), n)
}

/// One component's code (see [`encode_normal`]); the post-processing makes them in place of the
/// float map when only the normal PNG is written (`InferOptions::normal_map`).
#[inline(always)]
pub fn normal_code(c: f32) -> u8 {
    // NaN codes 0, as `round() as u8` gives it: the same as -1.
    let c = if c.is_nan() { -1.0 } else { c.clamp(-1.0, 1.0) };
    let x = (c + 1.0) * 0.5 * 255.0;
    // SAFETY: x is finite and in [0, 255], so the conversion is exact truncation.
    let i: i32 = unsafe { x.to_int_unchecked() };
    (i + i32::from(x - i as f32 >= 0.5)) as u8
}

crate::simd::dispatch! {
    fn normal_codes / normal_codes_baseline(n: &[f32]) -> Vec<u8> {
        n.iter().map(|&c| normal_code(c)).collect()
    }
}
