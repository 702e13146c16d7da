//! How far one prediction is from another (`moge compare`): the figures the parity tests gate
//! on, for judging a fast mode (bf16, a server, another build) against a reference on one's own
//! photos. `a` is the reference: relative errors are relative to its depth.

use anyhow::{bail, Result};
use serde::Serialize;

use crate::infer::Prediction;

/// The figures of one pair of predictions of the same photo.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Figures {
    /// Pearson correlation over the pixels valid in both (`None`: fewer than 2 such pixels,
    /// or a map missing on one side).
    pub points_pcc: Option<f64>,
    pub depth_pcc: Option<f64>,
    pub normal_pcc: Option<f64>,
    /// |depth_b - depth_a| / depth_a over the pixels valid in both.
    pub depth_rel_median: Option<f64>,
    pub depth_rel_max: Option<f64>,
    /// Intersection over union of the validity masks (1 when both are empty).
    pub mask_iou: f64,
    /// Pixels valid in both.
    pub both_valid: usize,
    /// |fov_b - fov_a|, degrees.
    pub fov_x_diff: f64,
    pub fov_y_diff: f64,
    /// metric_scale_b / metric_scale_a.
    pub scale_ratio: f64,
}

/// Pearson's correlation of two equally long series; `None` below 2 samples or for a
/// constant series.
fn pcc(pairs: impl Iterator<Item = (f64, f64)>) -> Option<f64> {
    let (mut n, mut sa, mut sb, mut saa, mut sbb, mut sab) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (a, b) in pairs {
        n += 1.0;
        (sa, sb) = (sa + a, sb + b);
        (saa, sbb, sab) = (saa + a * a, sbb + b * b, sab + a * b);
    }
    if n < 2.0 {
        return None;
    }
    let cov = sab - sa * sb / n;
    let (va, vb) = (saa - sa * sa / n, sbb - sb * sb / n);
    if va <= 0.0 || vb <= 0.0 {
        // Both constant and equal is a perfect match; otherwise there is no correlation to give.
        return (va <= 0.0 && vb <= 0.0).then_some(1.0);
    }
    Some((cov / (va.sqrt() * vb.sqrt())).clamp(-1.0, 1.0))
}

/// The figures of `b` against the reference `a`. Errors: the two are not the same size.
pub fn figures(a: &Prediction, b: &Prediction) -> Result<Figures> {
    if (a.width, a.height) != (b.width, b.height) {
        bail!("the predictions are {}x{} and {}x{}: not of the same photo", a.width, a.height, b.width, b.height);
    }
    let both: Vec<usize> = (0..a.mask.len()).filter(|&i| a.mask[i] && b.mask[i] && a.depth[i].is_finite() && b.depth[i].is_finite()).collect();
    let either = a.mask.iter().zip(&b.mask).filter(|(x, y)| **x || **y).count();
    let triples = |x: &[f32], y: &[f32]| -> Option<f64> {
        if x.len() != 3 * a.mask.len() || y.len() != x.len() {
            return None;
        }
        pcc(both.iter().flat_map(|&i| (0..3).map(move |c| (x[3 * i + c] as f64, y[3 * i + c] as f64))).filter(|(p, q)| p.is_finite() && q.is_finite()))
    };
    let mut rel: Vec<f64> = both.iter().map(|&i| ((b.depth[i] as f64 - a.depth[i] as f64) / a.depth[i] as f64).abs()).filter(|r| r.is_finite()).collect();
    rel.sort_by(f64::total_cmp);
    let (fa, fb) = (a.fov_degrees(), b.fov_degrees());
    Ok(Figures {
        points_pcc: triples(&a.points, &b.points),
        depth_pcc: pcc(both.iter().map(|&i| (a.depth[i] as f64, b.depth[i] as f64))),
        normal_pcc: match (&a.normal, &b.normal) {
            (Some(x), Some(y)) => triples(x, y),
            _ => None,
        },
        depth_rel_median: (!rel.is_empty()).then(|| rel[rel.len() / 2]),
        depth_rel_max: rel.last().copied(),
        mask_iou: if either == 0 { 1.0 } else { both.len() as f64 / either as f64 },
        both_valid: both.len(),
        fov_x_diff: (fb.0 as f64 - fa.0 as f64).abs(),
        fov_y_diff: (fb.1 as f64 - fa.1 as f64).abs(),
        scale_ratio: b.metric_scale as f64 / a.metric_scale as f64,
    })
}

impl Figures {
    /// The worst of each figure over `all` (the lowest correlation and IoU, the largest error,
    /// the scale ratio farthest from 1); `None` for no figures.
    pub fn worst(all: &[Figures]) -> Option<Figures> {
        let min = |f: fn(&Figures) -> Option<f64>| all.iter().filter_map(f).min_by(f64::total_cmp);
        let max = |f: fn(&Figures) -> Option<f64>| all.iter().filter_map(f).max_by(f64::total_cmp);
        Some(Figures {
            points_pcc: min(|f| f.points_pcc),
            depth_pcc: min(|f| f.depth_pcc),
            normal_pcc: min(|f| f.normal_pcc),
            depth_rel_median: max(|f| f.depth_rel_median),
            depth_rel_max: max(|f| f.depth_rel_max),
            mask_iou: min(|f| Some(f.mask_iou))?,
            both_valid: all.iter().map(|f| f.both_valid).min()?,
            fov_x_diff: max(|f| Some(f.fov_x_diff))?,
            fov_y_diff: max(|f| Some(f.fov_y_diff))?,
            scale_ratio: all.iter().map(|f| f.scale_ratio).max_by(|x, y| x.ln().abs().total_cmp(&y.ln().abs()))?,
        })
    }
}

/// Limits on the figures; each `None` is not checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Gates {
    /// Lowest PCC of points, depth and normal.
    pub min_pcc: Option<f64>,
    pub max_depth_rel_median: Option<f64>,
    pub max_depth_rel: Option<f64>,
    pub min_mask_iou: Option<f64>,
    /// Largest fov_x / fov_y difference, degrees.
    pub max_fov_diff: Option<f64>,
    /// Largest |scale_ratio - 1| (either way: max(r, 1/r) - 1).
    pub max_scale_diff: Option<f64>,
}

impl Gates {
    /// What `f` fails, in words (empty: within every gate). A figure that could not be measured
    /// (no pixel valid in both) fails a gate on it.
    pub fn failures(&self, f: &Figures) -> Vec<String> {
        let mut out = Vec::new();
        let mut low = |name: &str, value: Option<f64>, gate: Option<f64>| {
            if let Some(g) = gate {
                match value {
                    Some(v) if v >= g => {}
                    Some(v) => out.push(format!("{name} {v:.6} < {g}")),
                    None => out.push(format!("{name} not measured (gate {g})")),
                }
            }
        };
        for (name, v) in [("points PCC", f.points_pcc), ("depth PCC", f.depth_pcc), ("normal PCC", f.normal_pcc)] {
            // A model without normals has no normal PCC on either side: not a failure.
            if name != "normal PCC" || v.is_some() {
                low(name, v, self.min_pcc);
            }
        }
        low("mask IoU", Some(f.mask_iou), self.min_mask_iou);
        let mut high = |name: &str, value: Option<f64>, gate: Option<f64>| {
            if let Some(g) = gate {
                match value {
                    Some(v) if v <= g => {}
                    Some(v) => out.push(format!("{name} {v:.6} > {g}")),
                    None => out.push(format!("{name} not measured (gate {g})")),
                }
            }
        };
        high("median relative depth error", f.depth_rel_median, self.max_depth_rel_median);
        high("max relative depth error", f.depth_rel_max, self.max_depth_rel);
        high("fov_x difference (deg)", Some(f.fov_x_diff), self.max_fov_diff);
        high("fov_y difference (deg)", Some(f.fov_y_diff), self.max_fov_diff);
        let off = f.scale_ratio.max(1.0 / f.scale_ratio) - 1.0;
        high("metric scale difference", Some(if off.is_nan() { f64::INFINITY } else { off }), self.max_scale_diff);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pred(depth: Vec<f32>, mask: Vec<bool>, fx: f32, scale: f32) -> Prediction {
        let points = depth.iter().flat_map(|&d| [d * 0.5, -d * 0.25, d]).collect();
        Prediction {
            width: depth.len(),
            height: 1,
            points,
            depth,
            normal: None,
            normal_png: None,
            mask,
            intrinsics: [[fx, 0.0, 0.5], [0.0, fx, 0.5], [0.0, 0.0, 1.0]],
            metric_scale: scale,
            focal: 1.0,
            shift: 0.0,
            per_step: Vec::new(),
            grid: (0, 0),
        }
    }

    #[test]
    fn figures_of_a_known_change() {
        let a = pred(vec![1.0, 2.0, 4.0, 8.0, 5.0], vec![true; 5], 0.5, 2.0);
        // Depth 10 % further, one pixel dropped from the mask, another focal length.
        let mut b = pred(vec![1.1, 2.2, 4.4, 8.8, 5.5], vec![true, true, true, true, false], 0.6, 2.2);
        b.depth[4] = f32::INFINITY;
        let f = figures(&a, &b).unwrap();
        assert!((f.depth_rel_median.unwrap() - 0.1).abs() < 1e-6 && (f.depth_rel_max.unwrap() - 0.1).abs() < 1e-6);
        assert!((f.depth_pcc.unwrap() - 1.0).abs() < 1e-9 && (f.points_pcc.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!((f.both_valid, f.mask_iou), (4, 0.8));
        let fov = |k: f64| (2.0 * (0.5 / k).atan()).to_degrees();
        assert!((f.fov_x_diff - (fov(0.5) - fov(0.6))).abs() < 1e-4);
        assert!((f.scale_ratio - 1.1).abs() < 1e-6);
        assert_eq!(f.normal_pcc, None);
        let gates = Gates { min_pcc: Some(0.999), max_depth_rel_median: Some(0.05), min_mask_iou: Some(0.9), ..Default::default() };
        let fails = gates.failures(&f);
        assert_eq!(fails.len(), 2, "{fails:?}");
        assert!(fails[0].starts_with("mask IoU 0.8") && fails[1].starts_with("median relative depth error 0.1"), "{fails:?}");
        assert!(Gates::default().failures(&f).is_empty());
    }

    #[test]
    fn the_worst_of_several_and_anticorrelation() {
        let a = pred(vec![1.0, 2.0, 3.0], vec![true; 3], 0.5, 1.0);
        let b = pred(vec![3.0, 2.0, 1.0], vec![true; 3], 0.5, 0.5);
        let f = figures(&a, &b).unwrap();
        assert!((f.depth_pcc.unwrap() + 1.0).abs() < 1e-9);
        let same = figures(&a, &a).unwrap();
        assert_eq!(same.depth_rel_max, Some(0.0));
        let w = Figures::worst(&[same, f]).unwrap();
        assert_eq!((w.depth_pcc, w.scale_ratio), (f.depth_pcc, 0.5));
        assert!(Figures::worst(&[]).is_none());
        let other = pred(vec![1.0; 4], vec![true; 4], 0.5, 1.0);
        assert!(figures(&a, &other).unwrap_err().to_string().contains("3x1 and 4x1"));
    }
}
