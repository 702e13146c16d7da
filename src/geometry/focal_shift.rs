//! `recover_focal_shift` (`moge/utils/geometry_torch.py`): sample the affine point map on a
//! 64x64 nearest grid, then find the z-shift s (and, unless given, the focal f) minimising
//! Σ |f·xy/(z+s) − uv|². Upstream uses SciPy's Levenberg–Marquardt with `ftol=1e-3`; this is
//! our own 1-D LM with an analytic derivative, iterated to full convergence (a step under 1e-12
//! of the shift, or a cost drop under 1e-16 of the cost), so that the shift is the minimum
//! itself rather than wherever SciPy's tolerance stops.
//! For a given s the best focal is closed form (variable projection), so the search is 1-D.

use super::resize::nearest_axis;
use super::uv::view_plane_uv;

pub const DOWNSAMPLE: usize = 64;

/// Focal (relative to the half image diagonal) and shift, as `recover_focal_shift` returns them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FocalShift {
    pub focal: f32,
    pub shift: f32,
}

/// `points` is (H, W, 3) interleaved, `mask` (H, W) or None for "all valid".
///
/// Degenerate inputs (documented behaviour, upstream raises or returns garbage):
/// - samples with a non-finite coordinate are left out;
/// - fewer than two usable samples: focal = the given focal or 1, shift = 0 (as upstream);
/// - a solve that ends non-finite: shift = 0 and the closed-form focal at shift 0, or 1 if that
///   is not finite either.
pub fn recover_focal_shift(points: &[f32], mask: Option<&[bool]>, width: usize, height: usize, focal: Option<f32>) -> FocalShift {
    assert_eq!(points.len(), width * height * 3);
    recover_focal_shift_sampled(width, height, focal, |x, y| {
        let i = y * width + x;
        if mask.is_some_and(|m| !m[i]) {
            return None;
        }
        Some([points[3 * i], points[3 * i + 1], points[3 * i + 2]])
    })
}

/// As [`recover_focal_shift`], reading only the 64x64 samples: `sample(x, y)` gives the point
/// of pixel (x, y), or None where the mask is off. The post-processing computes those pixels
/// alone before the full-size pass, which needs the shift.
pub fn recover_focal_shift_sampled(width: usize, height: usize, focal: Option<f32>, sample: impl Fn(usize, usize) -> Option<[f32; 3]>) -> FocalShift {
    let (u, v) = view_plane_uv(width, height, width as f64 / height as f64);
    let ys = nearest_axis(height, DOWNSAMPLE);
    let xs = nearest_axis(width, DOWNSAMPLE);
    let mut uv = Vec::with_capacity(DOWNSAMPLE * DOWNSAMPLE);
    let mut xyz = Vec::with_capacity(DOWNSAMPLE * DOWNSAMPLE);
    for &y in &ys {
        for &x in &xs {
            let Some(p) = sample(x, y) else { continue };
            if p.iter().all(|c| c.is_finite()) {
                uv.push([u[x] as f64, v[y] as f64]);
                xyz.push(p);
            }
        }
    }
    if uv.len() < 2 {
        return FocalShift { focal: focal.unwrap_or(1.0), shift: 0.0 };
    }
    let problem = Problem { uv: &uv, xyz: &xyz, focal: focal.map(f64::from) };
    let shift = problem.solve().map(|s| s as f32).filter(|s| s.is_finite()).unwrap_or(0.0);
    let focal = match focal {
        Some(f) => f,
        None => {
            let f = closed_form_focal(&uv, &xyz, shift);
            if f.is_finite() {
                f
            } else {
                1.0
            }
        }
    };
    FocalShift { focal, shift }
}

/// Upstream's final focal: with s in float32, p = xy/(z+s) and f = Σ<p,uv>/Σ|p|².
fn closed_form_focal(uv: &[[f64; 2]], xyz: &[[f32; 3]], shift: f32) -> f32 {
    let (mut a, mut b) = (0f64, 0f64);
    for (q, p) in uv.iter().zip(xyz) {
        let d = p[2] + shift;
        let (px, py) = (p[0] / d, p[1] / d);
        a += px as f64 * q[0] + py as f64 * q[1];
        b += px as f64 * px as f64 + py as f64 * py as f64;
    }
    (a / b) as f32
}

struct Problem<'a> {
    uv: &'a [[f64; 2]],
    xyz: &'a [[f32; 3]],
    focal: Option<f64>,
}

impl Problem<'_> {
    /// Cost ½Σr² and its derivative terms J·r, J·J at shift s.
    fn eval(&self, s: f64) -> (f64, f64, f64) {
        // Closed-form focal and its derivative for this s (variable projection).
        let (f, df) = match self.focal {
            Some(f) => (f, 0.0),
            None => {
                let (mut a, mut b, mut da, mut db) = (0.0, 0.0, 0.0, 0.0);
                for (q, p) in self.uv.iter().zip(self.xyz) {
                    let d = p[2] as f64 + s;
                    let (px, py) = (p[0] as f64 / d, p[1] as f64 / d);
                    let (dpx, dpy) = (-px / d, -py / d);
                    a += px * q[0] + py * q[1];
                    b += px * px + py * py;
                    da += dpx * q[0] + dpy * q[1];
                    db += 2.0 * (px * dpx + py * dpy);
                }
                (a / b, (da * b - a * db) / (b * b))
            }
        };
        let (mut cost, mut jr, mut jj) = (0.0, 0.0, 0.0);
        for (q, p) in self.uv.iter().zip(self.xyz) {
            let d = p[2] as f64 + s;
            let (px, py) = (p[0] as f64 / d, p[1] as f64 / d);
            let (rx, ry) = (f * px - q[0], f * py - q[1]);
            let (jx, jy) = (df * px - f * px / d, df * py - f * py / d);
            cost += rx * rx + ry * ry;
            jr += jx * rx + jy * ry;
            jj += jx * jx + jy * jy;
        }
        (0.5 * cost, jr, jj)
    }

    /// Levenberg–Marquardt from s = 0 (upstream's x0).
    fn solve(&self) -> Option<f64> {
        let mut s = 0.0f64;
        let (mut cost, mut jr, mut jj) = self.eval(s);
        if !cost.is_finite() {
            return None;
        }
        let mut lambda = 1e-3 * jj.max(f64::MIN_POSITIVE);
        for _ in 0..200 {
            if jj == 0.0 || !jj.is_finite() {
                break;
            }
            let step = -jr / (jj + lambda);
            let trial = s + step;
            let (c, r, j) = self.eval(trial);
            if c.is_finite() && c <= cost {
                let converged = step.abs() <= 1e-12 * (1.0 + s.abs()) || (cost - c) <= 1e-16 * cost;
                s = trial;
                (cost, jr, jj) = (c, r, j);
                lambda = (lambda * 0.1).max(1e-30);
                if converged {
                    break;
                }
            } else {
                lambda *= 10.0;
                if lambda > 1e30 {
                    break;
                }
            }
        }
        s.is_finite().then_some(s)
    }
}
