//! The seed system's PNG encodings: `x.depth.png` 16-bit gray, metres = value × scale,
//! 0 = invalid; `x.normal.png` 8-bit RGB with n = v/255·2 − 1; `x.mask.png` 8-bit gray,
//! 255 = valid.

use std::io::BufWriter;
use std::path::Path;

use anyhow::Result;
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder};

use super::write_atomic;
use crate::infer::Prediction;

/// Depth in units of `scale`, rounded; 0 for invalid pixels. Valid depths that do not fit
/// (beyond 65535 units, or under half a unit, which would read as invalid) saturate to
/// 65535 / 1; returns the codes and how many saturated.
pub fn encode_depth(p: &Prediction, scale: f32) -> (Vec<u16>, usize) {
    let mut saturated = 0;
    let codes = p
        .depth
        .iter()
        .zip(&p.mask)
        .map(|(&d, &m)| {
            if !m || !d.is_finite() || d <= 0.0 {
                return 0;
            }
            let v = (d as f64 / scale as f64).round();
            if v > 65535.0 {
                saturated += 1;
                65535
            } else if v < 1.0 {
                saturated += 1;
                1
            } else {
                v as u16
            }
        })
        .collect();
    (codes, saturated)
}

/// `round((n + 1) / 2 · 255)` per component; masked normals are zero vectors → 128.
pub fn encode_normal(n: &[f32]) -> Vec<u8> {
    n.iter().map(|&c| (((c.clamp(-1.0, 1.0) + 1.0) * 0.5 * 255.0).round()) as u8).collect()
}

pub fn write_depth(path: &Path, p: &Prediction, scale: f32) -> Result<usize> {
    let (codes, saturated) = encode_depth(p, scale);
    // The encoder takes 16-bit samples in native byte order (PNG's big-endian is its job).
    let bytes: Vec<u8> = codes.iter().flat_map(|v| v.to_ne_bytes()).collect();
    write_png(path, &bytes, p.width, p.height, ExtendedColorType::L16)?;
    Ok(saturated)
}

pub fn write_normal(path: &Path, p: &Prediction) -> Result<()> {
    let n = p.normal.as_ref().ok_or_else(|| anyhow::anyhow!("the model has no normal head"))?;
    write_png(path, &encode_normal(n), p.width, p.height, ExtendedColorType::Rgb8)
}

pub fn write_mask(path: &Path, p: &Prediction) -> Result<()> {
    let m: Vec<u8> = p.mask.iter().map(|&v| if v { 255 } else { 0 }).collect();
    write_png(path, &m, p.width, p.height, ExtendedColorType::L8)
}

/// `data` as the encoder takes it: 8-bit samples, or 16-bit ones in native byte order.
pub fn write_png(path: &Path, data: &[u8], w: usize, h: usize, color: ExtendedColorType) -> Result<()> {
    write_atomic(path, |f| {
        let mut out = BufWriter::new(f);
        PngEncoder::new(&mut out).write_image(data, w as u32, h as u32, color)?;
        std::io::Write::flush(&mut out)?;
        Ok(())
    })
}
