//! MoGe's depth brought to a reconstruction's scale: one factor per image, fitted robustly to
//! the depths of the 3D points the image observes.
//!
//! MoGe's depth is metric and right up to its scale (the focal and shift are solved, as
//! `infer()` does), so a scale alone is fitted, on log depth ratios, where a factor is a
//! shift and errors are relative: the median ratio, then the mean over the inliers (within
//! three robust standard deviations, 1.4826 · MAD, of the median, and at least 2 %), which a
//! third of the points wrong does not move.

use serde::Serialize;

use super::model::Observation;
use crate::geometry::median;
use crate::infer::Prediction;

/// The fewest observed points a fit is made from.
pub const MIN_POINTS: usize = 3;

/// A fitted scale: the reconstruction's depth = `scale` · MoGe's depth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Fit {
    /// `scale`: a factor on depth (the only kind fitted).
    pub kind: &'static str,
    pub scale: f64,
    /// The image's observed 3D points with a depth in front of the camera and a valid MoGe
    /// depth at their pixel.
    pub points: usize,
    pub inliers: usize,
    /// Root mean square of the inliers' log ratios about the fit (≈ relative error).
    pub residual: f64,
    /// Median |MoGe / reconstruction - 1| over the points before the fit, and after it.
    pub median_rel_error_before: f64,
    pub median_rel_error_after: f64,
}

/// MoGe's depth at a pixel position (x, y; the image's top-left corner at 0, 0): bilinear
/// over the four nearest pixels, `None` unless all four have a depth.
pub fn depth_at(p: &Prediction, [x, y]: [f64; 2]) -> Option<f64> {
    let (fx, fy) = (x - 0.5, y - 0.5);
    if !(fx >= 0.0 && fy >= 0.0) {
        return None;
    }
    let (x0, y0) = (fx.floor() as usize, fy.floor() as usize);
    let (x1, y1) = ((x0 + 1).min(p.width - 1), (y0 + 1).min(p.height - 1));
    if x0 >= p.width || y0 >= p.height {
        return None;
    }
    let (wx, wy) = (fx - x0 as f64, fy - y0 as f64);
    let at = |xx: usize, yy: usize| {
        let i = yy * p.width + xx;
        let d = p.depth[i];
        (p.mask[i] && d.is_finite() && d > 0.0).then_some(d as f64)
    };
    let (a, b, c, d) = (at(x0, y0)?, at(x1, y0)?, at(x0, y1)?, at(x1, y1)?);
    Some((a * (1.0 - wx) + b * wx) * (1.0 - wy) + (c * (1.0 - wx) + d * wx) * wy)
}

/// The scale that brings `pred`'s depth to the observations', or why there is none.
pub fn fit_scale(pred: &Prediction, observed: &[Observation]) -> Result<Fit, String> {
    let pairs: Vec<(f64, f64)> =
        observed.iter().filter(|o| o.depth > 0.0 && o.depth.is_finite()).filter_map(|o| Some((depth_at(pred, o.pixel)?, o.depth))).collect();
    if pairs.len() < MIN_POINTS {
        return Err(format!(
            "{} of its {} observed 3D points are in front of the camera where MoGe has a depth: at least {MIN_POINTS} are needed to fit a scale",
            pairs.len(),
            observed.len()
        ));
    }
    let logs: Vec<f64> = pairs.iter().map(|&(m, c)| (c / m).ln()).collect();
    let mid = median(&mut logs.clone());
    let mad = median(&mut logs.iter().map(|r| (r - mid).abs()).collect::<Vec<_>>());
    let bound = (3.0 * 1.4826 * mad).max(0.02);
    let inliers: Vec<f64> = logs.iter().copied().filter(|r| (r - mid).abs() <= bound).collect();
    let mean = inliers.iter().sum::<f64>() / inliers.len() as f64;
    let residual = (inliers.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / inliers.len() as f64).sqrt();
    let scale = mean.exp();
    let rel = |k: f64| median(&mut pairs.iter().map(|&(m, c)| (k * m / c - 1.0).abs()).collect::<Vec<_>>());
    Ok(Fit {
        kind: "scale",
        scale,
        points: pairs.len(),
        inliers: inliers.len(),
        residual,
        median_rel_error_before: rel(1.0),
        median_rel_error_after: rel(scale),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(w: usize, h: usize, d: f32) -> Prediction {
        Prediction {
            width: w,
            height: h,
            points: vec![0.0; 3 * w * h],
            depth: (0..w * h).map(|i| d + (i % w) as f32 * 0.01).collect(),
            normal: None,
            normal_png: None,
            mask: vec![true; w * h],
            intrinsics: [[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]],
            metric_scale: 1.0,
            focal: 1.0,
            shift: 0.0,
            per_step: Vec::new(),
            grid: (1, 1),
        }
    }

    /// A third of the points wrong by far does not move the scale.
    #[test]
    fn the_scale_holds_against_outliers() {
        let p = flat(40, 30, 2.0);
        let mut obs = Vec::new();
        for i in 0..30 {
            let pixel = [(i % 10) as f64 * 3.7 + 1.0, (i / 10) as f64 * 8.0 + 2.0];
            let m = depth_at(&p, pixel).unwrap();
            let c = if i % 3 == 0 { m * 40.0 } else { m * 2.5 * (1.0 + 0.001 * ((i % 5) as f64 - 2.0)) };
            obs.push(Observation { pixel, depth: c });
        }
        let f = fit_scale(&p, &obs).unwrap();
        assert!((f.scale - 2.5).abs() < 2.5 * 2e-3, "{f:?}");
        assert_eq!((f.points, f.inliers), (30, 20));
        assert!(f.median_rel_error_after < 0.002 && f.median_rel_error_before > 0.5, "{f:?}");
    }

    #[test]
    fn too_few_points_and_masked_pixels() {
        let mut p = flat(10, 10, 1.0);
        p.mask[0] = false;
        assert_eq!(depth_at(&p, [0.9, 0.9]), None);
        assert_eq!(depth_at(&p, [10.5, 3.0]), None);
        assert!((depth_at(&p, [5.5, 5.5]).unwrap() - 1.05).abs() < 1e-6);
        let obs = [Observation { pixel: [5.0, 5.0], depth: 2.0 }, Observation { pixel: [0.9, 0.9], depth: 2.0 }];
        let e = fit_scale(&p, &obs).unwrap_err();
        assert!(e.starts_with("1 of its 2 observed 3D points"), "{e}");
    }
}
