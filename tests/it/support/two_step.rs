//! Upstream's two steps, transcribed as the tests' reference: `forward()`'s maps at the input
//! size, then `infer()`'s focal/shift, projection, scale and mask over them. The tool runs
//! both in one pass (`moge::Model::postprocess`); `host_paths.rs` holds the two side by side,
//! bit for bit.

use moge::geometry::focal_shift::recover_focal_shift;
use moge::geometry::resize::resize_bilinear;
// The per-pixel pieces are the library's own (as before the two steps moved here): these
// tests hold the two steps' order and maps to the one pass, not those formulas.
use moge::infer::{given_focal, intrinsics_of, normalized, rays, remap_point, sigmoid, InferOptions, Prediction};
use moge::model::config::RemapOutput;
use moge::model::RawOutput;

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
    points.chunks_exact_mut(3).for_each(|p| remap_point(remap, p));
    let normal = raw.normal.as_ref().map(|n| {
        let mut n = resize_interleave(n, 3, raw.size, width, height);
        n.chunks_exact_mut(3).for_each(|v| (v[0], v[1], v[2]) = normalized(v[0], v[1], v[2]));
        n
    });
    let mask = raw.mask.as_ref().map(|m| {
        let mut m = resize_bilinear(m, 1, raw.size.0, raw.size.1, height, width);
        m.iter_mut().for_each(|v| *v = sigmoid(*v));
        m
    });
    ForwardMaps { points, normal, mask, metric_scale: raw.metric_scale.map(f32::exp) }
}

/// `infer()` after `forward()`.
pub fn postprocess(fwd: ForwardMaps, width: usize, height: usize, grid: (usize, usize), opts: &InferOptions) -> Prediction {
    let ForwardMaps { mut points, mut normal, mask, metric_scale } = fwd;
    let mut mask_binary: Option<Vec<bool>> = mask.map(|m| m.iter().map(|&v| v > 0.5).collect());
    let fs = recover_focal_shift(&points, mask_binary.as_deref(), width, height, given_focal(opts, width, height));
    let focal = fs.focal;
    let intrinsics = intrinsics_of(focal, width, height);
    let (fx, fy) = (intrinsics[0][0], intrinsics[1][1]);

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
        let (ray_x, ray_y) = (rays(width, fx), rays(height, fy));
        for (i, p) in points.chunks_exact_mut(3).enumerate() {
            let d = depth[i];
            p[0] = ray_x[i % width] * d;
            p[1] = ray_y[i / width] * d;
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
        normal_png: None,
        mask,
        intrinsics,
        metric_scale: metric_scale.unwrap_or(1.0),
        focal,
        shift: fs.shift,
        per_step: Vec::new(),
        grid,
    }
}
