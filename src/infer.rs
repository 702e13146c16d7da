//! Upstream `MoGeModel.infer` after the network: resize the head outputs to the input size,
//! remap, solve focal and shift, build intrinsics, re-project, apply metric scale and mask.

use crate::geometry::focal_shift::recover_focal_shift;
use crate::geometry::resize::resize_bilinear;
use crate::geometry::uv::linspace;
use crate::model::config::RemapOutput;
use crate::model::RawOutput;

/// The options of `infer()` (and of `moge predict`).
#[derive(Debug, Clone, PartialEq)]
pub struct InferOptions {
    /// Base ViT tokens; `None` uses `resolution_level`.
    pub num_tokens: Option<u32>,
    /// 0..=9 maps onto the checkpoint's `num_tokens_range` (upstream default 9).
    pub resolution_level: u32,
    /// Known horizontal field of view in degrees.
    pub fov_x: Option<f32>,
    pub force_projection: bool,
    pub apply_mask: bool,
}

impl Default for InferOptions {
    fn default() -> Self {
        Self { num_tokens: None, resolution_level: 9, fov_x: None, force_projection: true, apply_mask: true }
    }
}

impl InferOptions {
    /// `int(min + level/9 · (max − min))`, truncating a float64 as upstream does.
    pub fn tokens(&self, range: [u32; 2]) -> u32 {
        match self.num_tokens {
            Some(n) => n,
            None => {
                let (lo, hi) = (range[0] as f64, range[1] as f64);
                (lo + (self.resolution_level as f64 / 9.0) * (hi - lo)) as u32
            }
        }
    }
}

/// Per-image geometry, all maps at the input resolution, OpenCV camera axes
/// (x right, y down, z forward), metres when the model has a metric scale head.
#[derive(Debug, Clone)]
pub struct Prediction {
    pub width: usize,
    pub height: usize,
    /// (H, W, 3) interleaved; +inf where masked (with `apply_mask`).
    pub points: Vec<f32>,
    /// (H, W); +inf where masked.
    pub depth: Vec<f32>,
    /// (H, W, 3) unit normals, zero where masked; None for models without a normal head.
    pub normal: Option<Vec<f32>>,
    /// (H, W), true = valid.
    pub mask: Vec<bool>,
    /// Normalised intrinsics (image = unit square), row-major.
    pub intrinsics: [[f32; 3]; 3],
    /// exp of the scale head (1 without one).
    pub metric_scale: f32,
    /// The recovered focal (relative to the half diagonal) and z-shift.
    pub focal: f32,
    pub shift: f32,
    /// Tokens actually used: (rows, cols) of the ViT grid.
    pub grid: (usize, usize),
}

impl Prediction {
    pub fn intrinsics_pixels(&self) -> [[f32; 3]; 3] {
        let (w, h) = (self.width as f32, self.height as f32);
        let k = self.intrinsics;
        [[k[0][0] * w, 0.0, k[0][2] * w], [0.0, k[1][1] * h, k[1][2] * h], [0.0, 0.0, 1.0]]
    }

    /// Horizontal and vertical field of view in degrees: 2·atan(0.5/f).
    pub fn fov_degrees(&self) -> (f32, f32) {
        let f = |k: f32| (2.0 * (0.5 / k as f64).atan()).to_degrees() as f32;
        (f(self.intrinsics[0][0]), f(self.intrinsics[1][1]))
    }

    pub fn valid_fraction(&self) -> f64 {
        if self.mask.is_empty() {
            return 0.0;
        }
        self.mask.iter().filter(|&&m| m).count() as f64 / self.mask.len() as f64
    }

    /// Median of the finite depths under the mask; NaN when there is none.
    pub fn median_depth(&self) -> f32 {
        let mut d: Vec<f32> = self.depth.iter().zip(&self.mask).filter(|(v, &m)| m && v.is_finite()).map(|(v, _)| *v).collect();
        if d.is_empty() {
            return f32::NAN;
        }
        let mid = d.len() / 2;
        let (_, m, _) = d.select_nth_unstable_by(mid, f32::total_cmp);
        *m
    }

    /// `MoGeOutput(1920x1080, valid 90.5%, median depth 13.322 m, fov_x 86.1 deg, ...)`.
    pub fn summary(&self) -> String {
        let (fx, fy) = self.fov_degrees();
        format!(
            "MoGeOutput({}x{}, valid {:.1}%, median depth {:.3} m, fov_x {:.1} deg, fov_y {:.1} deg, metric_scale {:.4})",
            self.width,
            self.height,
            100.0 * self.valid_fraction(),
            self.median_depth(),
            fx,
            fy,
            self.metric_scale
        )
    }
}

/// The forward outputs at the input size, after remap / normalize / sigmoid / exp
/// (what upstream `forward()` returns).
pub struct ForwardMaps {
    pub points: Vec<f32>,
    pub normal: Option<Vec<f32>>,
    pub mask: Option<Vec<f32>>,
    pub metric_scale: Option<f32>,
}

/// Planar (C, h, w) → interleaved (H, W, C) at the input size.
fn resize_interleave(planar: &[f32], c: usize, (h, w): (usize, usize), width: usize, height: usize) -> Vec<f32> {
    let r = resize_bilinear(planar, c, h, w, height, width);
    let n = width * height;
    let mut out = vec![0f32; n * c];
    for ch in 0..c {
        for (i, v) in r[ch * n..(ch + 1) * n].iter().enumerate() {
            out[i * c + ch] = *v;
        }
    }
    out
}

/// Tail of upstream `forward()`: resize the head outputs, then remap, normalize, sigmoid, exp.
pub fn forward_maps(raw: &RawOutput, remap: RemapOutput, width: usize, height: usize) -> ForwardMaps {
    let mut points = resize_interleave(&raw.points, 3, raw.size, width, height);
    for p in points.chunks_exact_mut(3) {
        match remap {
            RemapOutput::Linear => {}
            RemapOutput::Exp => {
                let z = p[2].exp();
                p[0] *= z;
                p[1] *= z;
                p[2] = z;
            }
            RemapOutput::Sinh => p.iter_mut().for_each(|v| *v = v.sinh()),
            RemapOutput::SinhExp => {
                p[0] = p[0].sinh();
                p[1] = p[1].sinh();
                p[2] = p[2].exp();
            }
        }
    }
    let normal = raw.normal.as_ref().map(|n| {
        let mut n = resize_interleave(n, 3, raw.size, width, height);
        for v in n.chunks_exact_mut(3) {
            let norm = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt().max(1e-12);
            v.iter_mut().for_each(|c| *c /= norm);
        }
        n
    });
    let mask = raw.mask.as_ref().map(|m| {
        let mut m = resize_bilinear(m, 1, raw.size.0, raw.size.1, height, width);
        m.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp()));
        m
    });
    ForwardMaps { points, normal, mask, metric_scale: raw.metric_scale.map(f32::exp) }
}

/// `infer()` after `forward()`.
pub fn postprocess(fwd: ForwardMaps, width: usize, height: usize, grid: (usize, usize), opts: &InferOptions) -> Prediction {
    let ForwardMaps { mut points, mut normal, mask, metric_scale } = fwd;
    let aspect = width as f64 / height as f64;
    let diag = (1.0 + aspect * aspect).sqrt();
    let mut mask_binary: Option<Vec<bool>> = mask.map(|m| m.iter().map(|&v| v > 0.5).collect());

    let given_focal = opts.fov_x.map(|fov| {
        let half = (fov * (std::f32::consts::PI / 180.0)) / 2.0;
        (1.0 / half.tan()) * (aspect / diag) as f32
    });
    let fs = recover_focal_shift(&points, mask_binary.as_deref(), width, height, given_focal);
    let focal = fs.focal;
    let fx = focal / 2.0 * diag as f32 / aspect as f32;
    let fy = focal / 2.0 * diag as f32;
    let intrinsics = [[fx, 0.0, 0.5], [0.0, fy, 0.5], [0.0, 0.0, 1.0]];

    for p in points.chunks_exact_mut(3) {
        p[2] += fs.shift;
    }
    if let Some(m) = mask_binary.as_mut() {
        for (mv, p) in m.iter_mut().zip(points.chunks_exact(3)) {
            *mv &= p[2] > 0.0;
        }
    }
    let mut depth: Vec<f32> = points.chunks_exact(3).map(|p| p[2]).collect();

    if opts.force_projection {
        // utils3d depth_map_to_point_map: pixel centres in [0,1], X = (u − cx)/fx · d.
        let u = linspace(0.5 / width as f64, 1.0 - 0.5 / width as f64, width);
        let v = linspace(0.5 / height as f64, 1.0 - 0.5 / height as f64, height);
        for (i, p) in points.chunks_exact_mut(3).enumerate() {
            let d = depth[i];
            let (x, y) = (i % width, i / width);
            p[0] = (u[x] - 0.5) / fx * d;
            p[1] = (v[y] - 0.5) / fy * d;
            p[2] = d;
        }
    }
    if let Some(s) = metric_scale {
        points.iter_mut().for_each(|v| *v *= s);
        depth.iter_mut().for_each(|v| *v *= s);
    }
    if opts.apply_mask {
        if let Some(m) = &mask_binary {
            for (i, &valid) in m.iter().enumerate() {
                if !valid {
                    points[3 * i..3 * i + 3].fill(f32::INFINITY);
                    depth[i] = f32::INFINITY;
                    if let Some(n) = normal.as_mut() {
                        n[3 * i..3 * i + 3].fill(0.0);
                    }
                }
            }
        }
    }
    let mask = mask_binary.unwrap_or_else(|| vec![true; width * height]);
    Prediction {
        width,
        height,
        points,
        depth,
        normal,
        mask,
        intrinsics,
        metric_scale: metric_scale.unwrap_or(1.0),
        focal,
        shift: fs.shift,
        grid,
    }
}
