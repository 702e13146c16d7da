//! Images to look at, as upstream `moge infer --maps` draws them (`moge/utils/vis.py`):
//! `x.depth_vis.png` is the disparity through matplotlib's `Spectral` colormap, normalised
//! between its 0.1 % and 99 % quantiles (near = red, far = blue); `x.normal_vis.png` maps
//! normals to colours with y and z flipped.

use std::path::Path;

use anyhow::Result;
use image::ExtendedColorType;

use super::png::write_png;
use crate::infer::Prediction;

/// ColorBrewer's 11-class Spectral scheme, the control colours of matplotlib's `Spectral`.
const SPECTRAL: [[u8; 3]; 11] = [
    [0x9e, 0x01, 0x42],
    [0xd5, 0x3e, 0x4f],
    [0xf4, 0x6d, 0x43],
    [0xfd, 0xae, 0x61],
    [0xfe, 0xe0, 0x8b],
    [0xff, 0xff, 0xbf],
    [0xe6, 0xf5, 0x98],
    [0xab, 0xdd, 0xa4],
    [0x66, 0xc2, 0xa5],
    [0x32, 0x88, 0xbd],
    [0x5e, 0x4f, 0xa2],
];

/// The 256-entry table of `LinearSegmentedColormap.from_list("Spectral", SPECTRAL, N=256)`:
/// entry i is the piecewise-linear interpolation of the control colours at i/255.
pub fn spectral_lut() -> [[f64; 3]; 256] {
    let mut lut = [[0.0; 3]; 256];
    let last = SPECTRAL.len() - 1;
    for (i, e) in lut.iter_mut().enumerate() {
        let t = i as f64 / 255.0 * last as f64;
        let k = (t.floor() as usize).min(last - 1);
        let d = t - k as f64;
        for c in 0..3 {
            let (a, b) = (SPECTRAL[k][c] as f64 / 255.0, SPECTRAL[k + 1][c] as f64 / 255.0);
            e[c] = a + d * (b - a);
        }
    }
    lut
}

/// numpy `nanquantile` (linear) over the non-NaN values, already sorted.
fn quantile(sorted: &[f32], q: f64) -> f32 {
    if sorted.is_empty() {
        return f32::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    let t = pos - lo as f64;
    let (a, b) = (sorted[lo] as f64, sorted[hi] as f64);
    (a + (b - a) * t) as f32
}

/// Disparity 1/depth (0 for masked +inf depth; NaN for depth ≤ 0 or NaN).
fn disparity(depth: &[f32]) -> Vec<f32> {
    depth.iter().map(|&d| if d > 0.0 { 1.0 / d } else { f32::NAN }).collect()
}

/// The disparity range `colorize_depth` spans for `depth`: its 0.1 % and 99 % quantiles
/// (masked pixels, disparity 0, take part as upstream).
pub fn disparity_range(depth: &[f32]) -> (f32, f32) {
    let mut sorted: Vec<f32> = disparity(depth).into_iter().filter(|v| !v.is_nan()).collect();
    sorted.sort_unstable_by(f32::total_cmp);
    (quantile(&sorted, 0.001), quantile(&sorted, 0.99))
}

/// `colorize_depth(depth)`: RGB bytes. Disparity 1/depth (0 for masked +inf depth, which
/// takes part in the quantiles as upstream; depth ≤ 0 or NaN is black).
pub fn colorize_depth(depth: &[f32]) -> Vec<u8> {
    colorize_depth_in(depth, disparity_range(depth))
}

/// [`colorize_depth`] over a given disparity range (one range for every frame of a video, so
/// that a colour means one depth throughout).
pub fn colorize_depth_in(depth: &[f32], (lo, hi): (f32, f32)) -> Vec<u8> {
    let disp = disparity(depth);
    let lut = spectral_lut();
    let mut out = Vec::with_capacity(depth.len() * 3);
    for &v in &disp {
        let x = 1.0 - (v - lo) / (hi - lo);
        if x.is_nan() {
            out.extend_from_slice(&[0, 0, 0]);
            continue;
        }
        // matplotlib: x·N truncated, below 0 → first entry, at or above N → last entry.
        let xa = x * 256.0;
        let idx = if xa < 0.0 {
            0
        } else if xa >= 256.0 {
            255
        } else {
            xa as usize
        };
        for c in lut[idx] {
            out.push((c.clamp(0.0, 1.0) * 255.0) as u8);
        }
    }
    out
}

/// `colorize_normal`: `(n·[0.5, −0.5, −0.5] + 0.5)` clipped, ×255, truncated.
pub fn colorize_normal(n: &[f32]) -> Vec<u8> {
    n.chunks_exact(3)
        .flat_map(|v| {
            let f = |c: f32, s: f64| (((c as f64 * s + 0.5).clamp(0.0, 1.0)) * 255.0) as u8;
            [f(v[0], 0.5), f(v[1], -0.5), f(v[2], -0.5)]
        })
        .collect()
}

pub fn write_depth(path: &Path, p: &Prediction) -> Result<()> {
    write_png(path, &colorize_depth(&p.depth), p.width, p.height, ExtendedColorType::Rgb8)
}

pub fn write_normal(path: &Path, p: &Prediction) -> Result<()> {
    let n = p.normal.as_ref().ok_or_else(|| anyhow::anyhow!("the model has no normal head"))?;
    write_png(path, &colorize_normal(n), p.width, p.height, ExtendedColorType::Rgb8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lut_ends_are_the_control_colours_and_midpoint_is_the_centre() {
        let lut = spectral_lut();
        let rgb = |e: [f64; 3]| e.map(|c| (c * 255.0).round() as u8);
        assert_eq!(rgb(lut[0]), SPECTRAL[0]);
        assert_eq!(rgb(lut[255]), SPECTRAL[10]);
        // 127.5/255 is the 6th control point; entries 127 and 128 straddle it.
        for c in 0..3 {
            let mid = SPECTRAL[5][c] as f64 / 255.0;
            assert!((lut[127][c] - mid).abs() < 0.02 && (lut[128][c] - mid).abs() < 0.02);
        }
    }

    #[test]
    fn near_is_red_far_is_blue_masked_is_far_and_nonpositive_is_black() {
        // Depths 1..=100 plus a masked pixel (+inf) and a negative one.
        let mut d: Vec<f32> = (1..=100).map(|v| v as f32).collect();
        d.push(f32::INFINITY);
        d.push(-1.0);
        let c = colorize_depth(&d);
        let px = |i: usize| [c[3 * i], c[3 * i + 1], c[3 * i + 2]];
        // ×255 truncates, so k/255·255 may land one below k.
        let close = |a: [u8; 3], b: [u8; 3]| a.iter().zip(&b).all(|(x, y)| (*x as i32 - *y as i32).abs() <= 1);
        // Nearest (largest disparity, beyond the 99 % quantile) → x < 0 → first colour.
        assert!(close(px(0), SPECTRAL[0]), "{:?}", px(0));
        // +inf depth: disparity 0 is the minimum → x = 1 → last colour.
        assert!(close(px(100), SPECTRAL[10]), "{:?}", px(100));
        assert_eq!(px(101), [0, 0, 0]);
        // At the 99 % quantile (depth 2) the colour is the first one, red; far (depth 100) is blue.
        assert!(close(px(1), SPECTRAL[0]), "{:?}", px(1));
        assert!(px(99)[2] > px(99)[0], "{:?}", px(99));
    }

    #[test]
    fn normal_colours_follow_upstream() {
        let c = colorize_normal(&[0.0, 0.0, -1.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0]);
        // Facing the camera (z = −1) → (127, 127, 255); x = 1, y = −1 → (255, 255, 127).
        assert_eq!(c, vec![127, 127, 255, 255, 255, 127, 127, 127, 127]);
    }
}
