//! 360° panoramas, as upstream's `moge infer_panorama` makes them (`moge/scripts/infer_panorama.py`
//! over `moge/utils/panorama.py`): an equirectangular picture is cut into twelve 90° views
//! ([`split`]), each view runs through the model with its field of view given and no mask
//! applied, and the views' distance maps are merged into one equirectangular distance map
//! ([`merge`]), which makes the points and the mask at the picture's size ([`assemble`]).
//!
//! What moge adds: the metric scale. Upstream's merge fixes only differences of log distance,
//! so its map's scale is arbitrary; moge multiplies it by exp(median over views of each view's
//! median log-distance offset to the merged map), which carries the views' metric scale (MoGe-2's
//! scale head) into the panorama.
//!
//! Points are in moge's camera axes (x right, y down, z forward), forward being the picture's
//! centre column on the horizon; depth is the distance from the centre. The mesh keeps the
//! pixels upstream's does ([`edges`]).

pub mod cameras;
pub mod edges;
pub mod lsmr;
pub mod merge;
pub mod split;

use anyhow::{bail, Result};

use crate::geometry::resize::resize_bilinear;
use crate::infer::Prediction;

/// Upstream's view size (`splitted_resolution`).
pub const VIEW_SIZE: usize = 512;

/// Upstream merges at most at this size (`min(1920, W)` x `min(960, H)`) and resizes after.
pub const MERGE_MAX: (usize, usize) = (1920, 960);

/// The smallest panorama taken (its height; the width is twice that).
pub const MIN_HEIGHT: u32 = 32;

/// Whether `width` x `height` is an equirectangular picture moge takes: twice as wide as high
/// (within 1 % or a pixel), at least [`MIN_HEIGHT`] high.
pub fn check_size(width: u32, height: u32) -> Result<(), String> {
    let (w, h) = (width as u64, height as u64);
    if height < MIN_HEIGHT {
        return Err(format!("a {width}x{height} panorama is too small: it needs at least {}x{MIN_HEIGHT} pixels", 2 * MIN_HEIGHT));
    }
    if w.abs_diff(2 * h) > (w / 100).max(1) {
        return Err(format!("a {width}x{height} picture is not an equirectangular panorama: its width must be twice its height (360° x 180°)"));
    }
    Ok(())
}

/// The merge's size for a `width` x `height` panorama.
pub fn merge_size(width: usize, height: usize) -> (usize, usize) {
    (width.min(MERGE_MAX.0), height.min(MERGE_MAX.1))
}

/// A panorama's geometry at the picture's size.
#[derive(Debug, Clone)]
pub struct Assembled {
    pub width: usize,
    pub height: usize,
    /// Metric distance from the centre, every pixel (unmasked).
    pub distance: Vec<f32>,
    pub mask: Vec<bool>,
    /// (H, W, 3) in moge's camera axes, every pixel (unmasked).
    pub points: Vec<f32>,
    /// The factor the merged map was multiplied by (exp of the median of the views' offsets);
    /// 1 where no view saw a valid pixel.
    pub scale: f32,
}

/// The merged map multiplied by the views' scale and resized to the picture (bilinear, as
/// `cv2.resize`; the mask by [`resize_mask`]), and the points along each pixel's direction.
pub fn assemble(m: &merge::Merged, width: usize, height: usize) -> Assembled {
    let mut offsets: Vec<f64> = m.log_offsets.iter().copied().filter(|v| v.is_finite()).collect();
    let scale = match crate::geometry::median(&mut offsets) {
        v if v.is_finite() => v.exp() as f32,
        _ => 1.0,
    };
    let scaled: Vec<f32> = m.distance.iter().map(|&d| d * scale).collect();
    let (distance, mask) = if (m.width, m.height) == (width, height) {
        (scaled, m.mask.clone())
    } else {
        let mask = resize_mask(&m.mask, m.width, m.height, width, height);
        (resize_bilinear(&scaled, 1, m.height, m.width, height, width), mask)
    };
    let dirs = cameras::grid_directions(width, height);
    let points = distance.iter().zip(&dirs).flat_map(|(&d, &dir)| cameras::to_camera_axes(dir).map(|c| c * d)).collect();
    Assembled { width, height, distance, mask, points, scale }
}

/// One axis of `cv2.resize`'s 8-bit bilinear: source indices and 11-bit weights. OpenCV moves
/// a tap outside the picture onto its edge with all the weight along x (`clamp_weights`), but
/// only clamps the rows along y.
fn opencv_taps(input: usize, output: usize, clamp_weights: bool) -> Vec<(usize, usize, i32, i32)> {
    let scale = input as f64 / output as f64;
    (0..output)
        .map(|d| {
            let f = ((d as f64 + 0.5) * scale - 0.5) as f32;
            let mut s = f.floor() as i64;
            let mut t = f - s as f32;
            if clamp_weights && s < 0 {
                (s, t) = (0, 0.0);
            }
            if clamp_weights && s >= input as i64 - 1 {
                (s, t) = (input as i64 - 1, 0.0);
            }
            let at = |i: i64| i.clamp(0, input as i64 - 1) as usize;
            let w = |v: f32| (v * 2048.0).round_ties_even() as i32;
            (at(s), at(s + 1), w(1.0 - t), w(t))
        })
        .collect()
}

/// The mask as upstream resizes it: `cv2.resize` of the 0/1 bytes, which its third argument
/// (`dst`, not the interpolation) leaves bilinear, then `> 0`. OpenCV's 8-bit vertical pass
/// (`VResizeLinearVec_32s8u`) drops the low 4 bits of the row sums and keeps the high half
/// of each product before rounding, so on 0/1 bytes a pixel is set only where the
/// interpolation reaches about 0.6 to 0.7: reproduced here (the few pixels at the end of a
/// row that OpenCV's scalar tail finishes may differ).
pub fn resize_mask(mask: &[bool], w: usize, h: usize, ow: usize, oh: usize) -> Vec<bool> {
    let (xs, ys) = (opencv_taps(w, ow, true), opencv_taps(h, oh, false));
    let rows: Vec<Vec<i32>> = (0..h)
        .map(|y| {
            let r = &mask[y * w..(y + 1) * w];
            xs.iter().map(|&(x0, x1, a0, a1)| i32::from(r[x0]) * a0 + i32::from(r[x1]) * a1).collect()
        })
        .collect();
    let hi = |v: i32, b: i32| ((v >> 4).clamp(-32768, 32767) * b) >> 16;
    ys.iter()
        .flat_map(|&(y0, y1, b0, b1)| {
            let (r0, r1) = (&rows[y0], &rows[y1]);
            (0..ow).map(move |x| ((hi(r0[x], b0) + hi(r1[x], b1) + 2) >> 2) > 0)
        })
        .collect()
}

/// A panorama's prediction and how it was made.
#[derive(Debug, Clone)]
pub struct Panorama {
    /// At the picture's size: `points` in moge's camera axes (see the module), `depth` the
    /// distance from the centre, +inf where masked when the mask is applied; `metric_scale` the
    /// factor carried into the merged map ([`Assembled::scale`]); no normals, no intrinsics
    /// (all zero: an equirectangular picture has none).
    pub prediction: Prediction,
    /// The metric distance of every pixel, the mask not applied (what the mesh's edges are
    /// found on, as upstream finds them).
    pub distance: Vec<f32>,
    /// Each view's own metric scale (its scale head), in the order of [`cameras::views`].
    pub view_metric_scales: Vec<f32>,
    /// The merge's size and LSMR's iterations per level, coarsest first.
    pub merge_size: (usize, usize),
    pub iterations: Vec<usize>,
    pub merge_ms: f64,
}

/// The panorama of a `width` x `height` picture from its views' predictions (made with the
/// views' 90° field of view given and no mask applied, in the order of [`cameras::views`]).
pub fn from_views(views: &[Prediction], width: usize, height: usize, apply_mask: bool) -> Result<Panorama> {
    let started = std::time::Instant::now();
    let cams = cameras::views();
    if views.len() != cams.len() {
        bail!("a panorama takes {} views, not {}", cams.len(), views.len());
    }
    let mut maps = Vec::with_capacity(views.len());
    for v in views {
        if v.width != v.height || v.points.len() != 3 * v.width * v.height {
            bail!("a view's prediction is {}x{} without its point map", v.width, v.height);
        }
        let distance: Vec<f32> = v.points.chunks_exact(3).map(|p| (p[0] * p[0] + p[1] * p[1] + p[2] * p[2]).sqrt()).collect();
        maps.push((v.width, distance));
    }
    let inputs: Vec<merge::ViewDistance> =
        maps.iter().zip(views).map(|((size, d), v)| merge::ViewDistance { size: *size, distance: d, mask: &v.mask }).collect();
    let (mw, mh) = merge_size(width, height);
    let merged = merge::merge(mw, mh, &cams, &inputs, &lsmr::Stop::UPSTREAM)?;
    let a = assemble(&merged, width, height);
    let (mut points, mut depth) = (a.points, a.distance.clone());
    if apply_mask {
        for (i, _) in a.mask.iter().enumerate().filter(|(_, &m)| !m) {
            depth[i] = f32::INFINITY;
            points[3 * i..3 * i + 3].fill(f32::INFINITY);
        }
    }
    let prediction = Prediction {
        width,
        height,
        points,
        depth,
        normal: None,
        normal_png: None,
        mask: a.mask,
        intrinsics: [[0.0; 3]; 3],
        metric_scale: a.scale,
        focal: 0.0,
        shift: 0.0,
        per_step: Vec::new(),
        grid: views[0].grid,
    };
    Ok(Panorama {
        prediction,
        distance: a.distance,
        view_metric_scales: views.iter().map(|v| v.metric_scale).collect(),
        merge_size: (mw, mh),
        iterations: merged.iterations,
        merge_ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked_with_a_reason() {
        assert!(check_size(4096, 2048).is_ok());
        assert!(check_size(4000, 2001).is_ok());
        assert!(check_size(64, 32).is_ok());
        assert!(check_size(1000, 600).unwrap_err().contains("twice its height"));
        assert!(check_size(40, 20).unwrap_err().contains("too small"));
        assert_eq!(merge_size(8000, 4000), (1920, 960));
        assert_eq!(merge_size(384, 192), (384, 192));
    }
}
