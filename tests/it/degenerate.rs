//! Defined behaviour on degenerate geometry (upstream raises or returns garbage here):
//! no valid pixel, non-finite values, no points at all. Never a panic.
use moge::geometry::focal_shift::recover_focal_shift;
use moge::InferOptions;

use crate::support::two_step::{postprocess, ForwardMaps};

fn plane(w: usize, h: usize, z: f32) -> Vec<f32> {
    let mut p = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            let (u, v) = ((x as f32 + 0.5) / w as f32 - 0.5, (y as f32 + 0.5) / h as f32 - 0.5);
            p.extend_from_slice(&[u, v, z + 0.3 * u]);
        }
    }
    p
}

#[test]
fn no_valid_pixel_gives_focal_one_shift_zero() {
    let (w, h) = (32, 24);
    let fs = recover_focal_shift(&plane(w, h, 2.0), Some(&vec![false; w * h]), w, h, None);
    assert_eq!((fs.focal, fs.shift), (1.0, 0.0));
    let fs = recover_focal_shift(&plane(w, h, 2.0), Some(&vec![false; w * h]), w, h, Some(0.7));
    assert_eq!((fs.focal, fs.shift), (0.7, 0.0));
}

/// Points of a pinhole camera with `focal` (half-diagonal units), z shifted by `-shift`.
fn camera(w: usize, h: usize, focal: f64, shift: f64) -> Vec<f32> {
    let (u, v) = moge::geometry::uv::view_plane_uv(w, h, w as f64 / h as f64);
    let mut p = Vec::new();
    for &vy in &v {
        for &ux in &u {
            let z = 2.0 + 0.5 * ux as f64 + 0.3 * vy as f64;
            p.extend_from_slice(&[(ux as f64 * z / focal) as f32, (vy as f64 * z / focal) as f32, (z - shift) as f32]);
        }
    }
    p
}

#[test]
fn non_finite_samples_are_left_out() {
    let (w, h) = (40, 30);
    let clean = camera(w, h, 1.5, 0.8);
    let mut dirty = clean.clone();
    for i in (0..w * h).step_by(7) {
        dirty[3 * i + 2] = f32::NAN;
        dirty[3 * i] = f32::INFINITY;
    }
    let a = recover_focal_shift(&clean, None, w, h, None);
    let b = recover_focal_shift(&dirty, None, w, h, None);
    assert!(b.focal.is_finite() && b.shift.is_finite());
    assert!((a.focal - 1.5).abs() < 1e-4 && (b.focal - 1.5).abs() < 1e-4, "{a:?} vs {b:?}");
    assert!((b.shift - 0.8).abs() < 1e-4, "{b:?}");
}

#[test]
fn all_non_finite_falls_back() {
    let (w, h) = (16, 16);
    let fs = recover_focal_shift(&vec![f32::NAN; w * h * 3], None, w, h, None);
    assert_eq!((fs.focal, fs.shift), (1.0, 0.0));
}

#[test]
fn fully_masked_prediction_is_all_invalid_without_panic() {
    let (w, h) = (20, 10);
    let fwd = ForwardMaps { points: plane(w, h, 1.5), normal: Some([0.0, 0.0, 1.0].repeat(w * h)), mask: Some(vec![0.1; w * h]), metric_scale: Some(2.0) };
    let p = postprocess(fwd, w, h, (5, 10), &InferOptions::default());
    assert!(p.mask.iter().all(|&m| !m));
    assert!(p.depth.iter().all(|d| *d == f32::INFINITY));
    assert!(p.points.iter().all(|d| *d == f32::INFINITY));
    assert!(p.normal.as_ref().unwrap().iter().all(|n| *n == 0.0));
    assert_eq!(p.focal, 1.0);
    assert!(p.median_depth().is_nan());
    assert!(p.summary().contains("valid 0.0%"));
}

#[test]
fn known_plane_recovers_its_focal_and_shift() {
    let (w, h) = (64, 48);
    let p = camera(w, h, 1.5, 0.8);
    let fs = recover_focal_shift(&p, None, w, h, None);
    assert!((fs.focal - 1.5).abs() < 1e-4, "{fs:?}");
    assert!((fs.shift - 0.8).abs() < 1e-4, "{fs:?}");
    let fs = recover_focal_shift(&p, None, w, h, Some(1.5));
    assert!((fs.shift - 0.8).abs() < 1e-4, "{fs:?}");
}
