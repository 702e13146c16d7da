//! Which pixels of a panorama its mesh keeps, as upstream's `infer_panorama.py` chooses them:
//! `mask & !(depth_map_edge(distance, rtol) & normal_map_edge(normals, tol = 5°))`, the normals
//! from the point map (`utils3d.np.point_map_to_normal_map`). A pixel goes only where the
//! distance jumps *and* the surface turns, so a slanted floor or wall keeps its pixels where a
//! photo's mesh (`outputs::edges`, depth jumps alone) would drop them.
//!
//! In float32 step by step as numpy computes it (utils3d 1.3, `numpy/maps.py`), NaN included:
//! the arccos of a dot product that rounds above 1 is NaN, which the window's maximum carries
//! (`ndarray.max`) and the pooling after it ignores (`nanmax`).

use super::cameras;
use crate::geometry::edges::depth_edge;

/// `utils3d.np.normal_map_edge`'s tolerance in `infer_panorama.py`, degrees.
const NORMAL_TOL_DEGREES: f64 = 5.0;

/// `infer_panorama.py`'s `--threshold` default: the relative distance jump of an edge.
pub const DEFAULT_RTOL: f32 = 0.03;

fn sub(a: [f32; 3], b: [f32; 3]) -> [f32; 3] {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2]]
}

/// numpy's `cross`: each component a product minus a product, in f32.
fn cross(a: [f32; 3], b: [f32; 3]) -> [f32; 3] {
    [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
}

/// `v / (np.linalg.norm(v) + 1e-12)`.
fn unit(v: [f32; 3]) -> [f32; 3] {
    let n = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt() + 1e-12f32;
    [v[0] / n, v[1] / n, v[2] / n]
}

/// `point_map_to_normal_map(points, mask)`: per pixel the sum of the unit normals of the four
/// triangles it makes with its neighbours (those whose corners are all in `mask`), made unit;
/// zero and false where none is.
pub fn normal_map(points: &[[f32; 3]], mask: &[bool], width: usize, height: usize) -> (Vec<[f32; 3]>, Vec<bool>) {
    let at = |x: isize, y: isize| -> ([f32; 3], bool) {
        if x < 0 || y < 0 || x >= width as isize || y >= height as isize {
            ([0.0; 3], false)
        } else {
            let i = y as usize * width + x as usize;
            (points[i], mask[i])
        }
    };
    let mut normals = vec![[0.0f32; 3]; width * height];
    let mut valid = vec![false; width * height];
    for y in 0..height as isize {
        for x in 0..width as isize {
            let (p, m) = at(x, y);
            let (up, mu) = at(x, y - 1);
            let (left, ml) = at(x - 1, y);
            let (down, md) = at(x, y + 1);
            let (right, mr) = at(x + 1, y);
            let (up, left, down, right) = (sub(up, p), sub(left, p), sub(down, p), sub(right, p));
            let tris = [(cross(up, left), mu && ml), (cross(left, down), ml && md), (cross(down, right), md && mr), (cross(right, up), mr && mu)];
            // (n0·v0 + n1·v1) + n2·v2 + n3·v3, each n unit and v 0 or 1, as numpy's sum over axis 0.
            let mut sum = [0.0f32; 3];
            let mut any = false;
            for (k, (n, ok)) in tris.into_iter().enumerate() {
                let ok = ok && m;
                any |= ok;
                let n = unit(n).map(|c| c * f32::from(u8::from(ok)));
                sum = if k == 0 { n } else { [sum[0] + n[0], sum[1] + n[1], sum[2] + n[2]] };
            }
            let i = y as usize * width + x as usize;
            valid[i] = any;
            normals[i] = if any { unit(sum) } else { [0.0; 3] };
        }
    }
    (normals, valid)
}

/// `normal_map_edge(normals, tol, mask=valid)`: per pixel the largest angle between its normal
/// and those of its 3x3 window (edge-replicated; 0 where the neighbour is not valid; NaN
/// propagates), then the largest over a 3x3 neighbourhood (NaN ignored), above `tol`.
pub fn normal_edge(normals: &[[f32; 3]], valid: &[bool], width: usize, height: usize) -> Vec<bool> {
    let n: Vec<[f32; 3]> = normals.iter().map(|&v| unit(v)).collect();
    let clamp = |v: isize, len: usize| v.clamp(0, len as isize - 1) as usize;
    let mut window_max = vec![0.0f32; width * height];
    for y in 0..height {
        for x in 0..width {
            let c = n[y * width + x];
            let mut worst = f32::NEG_INFINITY;
            'window: for dy in -1..=1isize {
                for dx in -1..=1isize {
                    let j = clamp(y as isize + dy, height) * width + clamp(x as isize + dx, width);
                    let angle = if valid[j] {
                        let q = n[j];
                        (c[0] * q[0] + c[1] * q[1] + c[2] * q[2]).acos()
                    } else {
                        0.0
                    };
                    if angle.is_nan() {
                        worst = f32::NAN;
                        break 'window;
                    }
                    worst = worst.max(angle);
                }
            }
            window_max[y * width + x] = worst;
        }
    }
    let tol = NORMAL_TOL_DEGREES.to_radians() as f32;
    let mut edge = vec![false; width * height];
    for y in 0..height {
        for x in 0..width {
            let mut pooled = f32::NAN;
            for yy in y.saturating_sub(1)..(y + 2).min(height) {
                for xx in x.saturating_sub(1)..(x + 2).min(width) {
                    let v = window_max[yy * width + xx];
                    // nanmax: NaN only where every value is.
                    if !v.is_nan() && (pooled.is_nan() || v > pooled) {
                        pooled = v;
                    }
                }
            }
            edge[y * width + x] = pooled > tol;
        }
    }
    edge
}

/// `distance[..., None] * spherical_uv_to_directions(uv_map(h, w))` in float32 step by step, as
/// `infer_panorama.py` makes the points it takes the normals of. The sines and cosines are
/// rounded from float64, where numpy's float32 ones are its own vector approximations (within
/// about an ulp): on the fixture 3 of 73,728 pixels of the mesh differ from upstream's for it,
/// where a normal's dot product with itself rounds above 1 on one side and not the other.
pub fn points(distance: &[f32], width: usize, height: usize) -> Vec<[f32; 3]> {
    let (us, vs) = (cameras::centres(width), cameras::centres(height));
    let (tau, pi) = (std::f64::consts::TAU as f32, std::f64::consts::PI as f32);
    let (sin, cos) = (|x: f32| (x as f64).sin() as f32, |x: f32| (x as f64).cos() as f32);
    let cols: Vec<(f32, f32)> = us.iter().map(|&u| (1.0 - u) * tau).map(|t| (cos(t), sin(t))).collect();
    let mut out = Vec::with_capacity(width * height);
    for (y, &v) in vs.iter().enumerate() {
        let phi = v * pi;
        let (sp, cp) = (sin(phi), cos(phi));
        for (x, &(ct, st)) in cols.iter().enumerate() {
            let d = distance[y * width + x];
            out.push([d * (sp * ct), d * (sp * st), d * cp]);
        }
    }
    out
}

/// The pixels the mesh keeps: `mask & !(depth edge & normal edge)`, from the distance map
/// without its mask applied (finite everywhere), in upstream's world axes as it computes them.
pub fn mesh_mask(distance: &[f32], mask: &[bool], width: usize, height: usize, rtol: f32) -> Vec<bool> {
    mesh_mask_of(&points(distance, width, height), distance, mask, width, height, rtol)
}

/// [`mesh_mask`] on given points (those of `distance`).
pub fn mesh_mask_of(points: &[[f32; 3]], distance: &[f32], mask: &[bool], width: usize, height: usize, rtol: f32) -> Vec<bool> {
    let (normals, valid) = normal_map(points, mask, width, height);
    let normal = normal_edge(&normals, &valid, width, height);
    let depth = depth_edge(distance, width, height, rtol);
    mask.iter().zip(depth.iter().zip(&normal)).map(|(&m, (&d, &n))| m && !(d && n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_between_two_walls_is_an_edge_and_a_slanted_plane_is_not() {
        // A plane through the panorama's pixels at distance 2, stepping to 3 halfway: the step
        // turns the surface's normals and jumps the distance; the rest is smooth.
        let (w, h) = (64, 32);
        let mut d = vec![2.0f32; w * h];
        for y in 0..h {
            for x in w / 2..w {
                d[y * w + x] = 3.0;
            }
        }
        let mask = vec![true; w * h];
        let keep = mesh_mask(&d, &mask, w, h, DEFAULT_RTOL);
        let row = h / 2;
        assert!(!keep[row * w + w / 2] && !keep[row * w + w / 2 - 1], "the step's pixels stay");
        assert!(keep[row * w + w / 4] && keep[row * w + 3 * w / 4 + 2], "smooth pixels go");
        // The masked pixels go whatever their neighbours.
        let mut mask = mask;
        mask[row * w + 5] = false;
        assert!(!mesh_mask(&d, &mask, w, h, DEFAULT_RTOL)[row * w + 5]);
    }

    #[test]
    fn normals_of_a_flat_patch_face_the_same_way_and_lone_pixels_have_none() {
        let (w, h) = (5, 4);
        let points: Vec<[f32; 3]> = (0..w * h).map(|i| [(i % w) as f32, (i / w) as f32, 1.0]).collect();
        let mut mask = vec![true; w * h];
        // A pixel whose four neighbours are all masked makes no triangle.
        for i in [w + 1, 2 * w, 2 * w + 2, 3 * w + 1] {
            mask[i] = false;
        }
        let (n, valid) = normal_map(&points, &mask, w, h);
        assert!(!valid[2 * w + 1] && n[2 * w + 1] == [0.0; 3]);
        assert!(valid[0] && valid[w * h - 1]);
        for i in (0..w * h).filter(|&i| valid[i]) {
            assert!((n[i][2].abs() - 1.0).abs() < 1e-6 && n[i][2] == n[0][2], "pixel {i}: {:?}", n[i]);
        }
    }
}
