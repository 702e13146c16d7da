//! The PNG encodings of the Tenstorrent MoGe-2 server (tt-MoGe): `x.depth.png` 16-bit gray, metres = value × scale,
//! 0 = invalid; `x.normal.png` 8-bit RGB with n = v/255·2 − 1; `x.mask.png` 8-bit gray,
//! 255 = valid.

use std::io::BufWriter;
use std::path::Path;

use anyhow::Result;
use image::ExtendedColorType;

use super::write_atomic;
use crate::infer::Prediction;
use crate::simd::isa;

/// The depth code of one pixel and whether it saturated (see [`encode_depth`]): `round(d /
/// scale)` half away from zero, clamped to 1..=65535, as `trunc(clamp(q + 0.5, 1, 65535))`
/// with q = d / scale in f64, so that the loop vectorises on any x86-64 instead of calling
/// libm's `round` per pixel. Exact: the quotient of two f32 (below 65536) is either a
/// half-integer or at least 2^-42 of itself away from every half-integer, far more than the
/// roundings of q and of q + 0.5 (2^-53 of it each), so trunc(q + 0.5) is floor(true quotient +
/// 0.5) — round half up, away from zero for these positive q; q < 0.5 or q >= 65535.5 are the
/// clamps' own cases (the saturations).
#[inline]
fn depth_code(d: f32, valid: bool, scale: f32) -> (u16, bool) {
    let ok = valid && d.is_finite() && d > 0.0;
    let q = d as f64 / scale as f64;
    // max / min as selects; a NaN (an invalid pixel's, or any pixel's under a NaN scale) takes
    // the first one's 1.0, as `x >= 1.0` is false for it.
    let x = q + 0.5;
    let x = if x >= 1.0 { x } else { 1.0 };
    let x = if x > 65535.0 { 65535.0 } else { x };
    // SAFETY: the two selects leave x in [1, 65535] whatever q was (infinities and NaN
    // included), so it is finite and its truncation fits an i32.
    let i: i32 = unsafe { x.to_int_unchecked() };
    let code = if ok { i as u16 } else { 0 };
    (code, ok && !(0.5..65535.5).contains(&q))
}

/// Depth in units of `scale`, rounded; 0 for invalid pixels. Valid depths that do not fit
/// (beyond 65535 units, or under half a unit, which would read as invalid) saturate to
/// 65535 / 1; returns the codes and how many saturated.
pub fn encode_depth(p: &Prediction, scale: f32) -> (Vec<u16>, usize) {
    let mut codes = vec![0u16; p.depth.len()];
    let saturated = depth_codes(isa::current(), &p.depth, &p.mask, scale, &mut codes);
    (codes, saturated)
}

// The per-pixel loops below, compiled for the widest vectors the CPU has (the baseline target
// only has SSE2, without a vector f64 -> u32 conversion); the same arithmetic in every build.
crate::simd::dispatch! {
    fn depth_codes / depth_codes_baseline(depth: &[f32], mask: &[bool], scale: f32, codes: &mut [u16]) -> usize {
        let mut saturated = 0;
        for ((c, &d), &m) in codes.iter_mut().zip(depth).zip(mask) {
            let (code, sat) = depth_code(d, m, scale);
            *c = code;
            saturated += usize::from(sat);
        }
        saturated
    }
}

crate::simd::dispatch! {
    fn saturated_count / saturated_count_baseline(depth: &[f32], mask: &[bool], scale: f32) -> usize {
        depth.iter().zip(mask).map(|(&d, &m)| usize::from(depth_code(d, m, scale).1)).sum()
    }
}

/// How many valid depths [`encode_depth`] would saturate, without the codes.
pub fn count_saturated(p: &Prediction, scale: f32) -> usize {
    saturated_count(isa::current(), &p.depth, &p.mask, scale)
}

/// The depth codes in PNG's byte order (big-endian), and how many saturated.
fn depth_samples(p: &Prediction, scale: f32) -> (Vec<u16>, usize) {
    let (mut codes, saturated) = encode_depth(p, scale);
    codes.iter_mut().for_each(|c| *c = c.to_be());
    (codes, saturated)
}

/// The 16-bit depth PNG of `p` and how many valid depths saturated.
pub fn depth_png(p: &Prediction, scale: f32) -> Result<(Vec<u8>, usize)> {
    let (samples, saturated) = depth_samples(p, scale);
    Ok((encode_png(bytemuck::cast_slice(&samples), p.width, p.height, ExtendedColorType::L16)?, saturated))
}

/// The normal PNG's codes: made by the post-processing, or from the float map.
fn normal_samples(p: &Prediction) -> Result<std::borrow::Cow<'_, [u8]>> {
    match (&p.normal_png, &p.normal) {
        (Some(codes), _) => Ok(codes.as_slice().into()),
        (None, Some(n)) => Ok(crate::geometry::codes::encode_normal(n).into()),
        (None, None) => anyhow::bail!("the model has no normal head"),
    }
}

pub fn normal_png(p: &Prediction) -> Result<Vec<u8>> {
    encode_png(&normal_samples(p)?, p.width, p.height, ExtendedColorType::Rgb8)
}

pub fn mask_png(p: &Prediction) -> Result<Vec<u8>> {
    encode_png(&mask_codes(p), p.width, p.height, ExtendedColorType::L8)
}

fn mask_codes(p: &Prediction) -> Vec<u8> {
    p.mask.iter().map(|&v| if v { 255 } else { 0 }).collect()
}

pub fn write_depth(path: &Path, p: &Prediction, scale: f32) -> Result<usize> {
    let (codes, saturated) = encode_depth(p, scale);
    write_gray16(path, codes, p.width, p.height)?;
    Ok(saturated)
}

/// 16-bit grey `codes`, `w` x `h`, as a PNG (big-endian, as PNG stores them).
pub fn write_gray16(path: &Path, mut codes: Vec<u16>, w: usize, h: usize) -> Result<()> {
    codes.iter_mut().for_each(|c| *c = c.to_be());
    write_png(path, bytemuck::cast_slice(&codes), w, h, ExtendedColorType::L16)
}

pub fn write_normal(path: &Path, p: &Prediction) -> Result<()> {
    write_png(path, &normal_samples(p)?, p.width, p.height, ExtendedColorType::Rgb8)
}

pub fn write_mask(path: &Path, p: &Prediction) -> Result<()> {
    write_png(path, &mask_codes(p), p.width, p.height, ExtendedColorType::L8)
}

/// `data` as PNG stores it: 8-bit samples, or 16-bit ones big-endian.
pub fn write_png(path: &Path, data: &[u8], w: usize, h: usize, color: ExtendedColorType) -> Result<()> {
    write_atomic(path, |f| {
        let mut out = BufWriter::new(f);
        encode_png_to(&mut out, data, w, h, color)?;
        std::io::Write::flush(&mut out)?;
        Ok(())
    })
}

/// The PNG file of `data` in memory (an HTTP response's field).
pub fn encode_png(data: &[u8], w: usize, h: usize, color: ExtendedColorType) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len() / 2);
    encode_png_to(&mut out, data, w, h, color)?;
    Ok(out)
}

fn encode_png_to(out: &mut impl std::io::Write, data: &[u8], w: usize, h: usize, color: ExtendedColorType) -> Result<()> {
    use png::{BitDepth, ColorType};
    let (ct, depth) = match color {
        ExtendedColorType::L8 => (ColorType::Grayscale, BitDepth::Eight),
        ExtendedColorType::L16 => (ColorType::Grayscale, BitDepth::Sixteen),
        ExtendedColorType::Rgb8 => (ColorType::Rgb, BitDepth::Eight),
        other => anyhow::bail!("internal: no PNG encoding of {other:?} here"),
    };
    let mut enc = png::Encoder::new(out, u32::try_from(w)?, u32::try_from(h)?);
    enc.set_color(ct);
    enc.set_depth(depth);
    // fdeflate's fast mode, one Paeth filter for every row: the same size as the adaptive
    // choice on depth and normal maps (which picks Paeth nearly everywhere), without trying
    // five filters per row (examples/png_bench.rs measures them).
    enc.set_compression(png::Compression::Fast);
    enc.set_filter(png::Filter::Paeth);
    let mut writer = enc.write_header()?;
    writer.write_image_data(data)?;
    writer.finish()?;
    Ok(())
}
