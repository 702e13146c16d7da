//! The sphere and the twelve views of upstream's panorama code (`moge/utils/panorama.py` with
//! utils3d 1.3): an equirectangular picture's (u, v) is a direction in upstream's world axes
//! (z up), and each view is a 90° x 90° camera at the centre looking at a vertex of the
//! icosahedron, its up the world's z.

/// Each view's field of view, both ways (`get_panorama_cameras`).
pub const VIEW_FOV_DEGREES: f32 = 90.0;

/// The views' normalised focal (`intrinsics_from_fov(90°, 90°)`: 1 / (2 tan 45°)); the principal
/// point is the centre.
const FOCAL: f64 = 0.5;

/// A view: world → camera rotation, rows x (right), y (down), z (forward), OpenCV axes
/// (`extrinsics_look_at([0, 0, 0], vertex, [0, 0, 1])`, in float32 as upstream casts it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct View {
    pub rotation: [[f32; 3]; 3],
}

/// The twelve views, in the order of utils3d's `create_icosahedron_mesh` vertices.
pub fn views() -> Vec<View> {
    let a = (1.0 + 5f64.sqrt()) / 2.0;
    let vertices = [
        [0.0, 1.0, a],
        [0.0, -1.0, a],
        [0.0, 1.0, -a],
        [0.0, -1.0, -a],
        [1.0, a, 0.0],
        [-1.0, a, 0.0],
        [1.0, -a, 0.0],
        [-1.0, -a, 0.0],
        [a, 0.0, 1.0],
        [a, 0.0, -1.0],
        [-a, 0.0, 1.0],
        [-a, 0.0, -1.0],
    ];
    vertices.iter().map(|&v| look_at(v.map(|c| c as f32 as f64), [0.0, 0.0, 1.0])).collect()
}

fn cross(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
}

fn unit(a: [f64; 3]) -> [f32; 3] {
    let n = (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt();
    a.map(|c| (c / n) as f32)
}

/// utils3d's `extrinsics_look_at` from the origin: z = target, x = (−up) × z, y = z × x.
fn look_at(target: [f64; 3], up: [f64; 3]) -> View {
    let z = target;
    let x = cross(up.map(|c| -c), z);
    let y = cross(z, x);
    View { rotation: [unit(x), unit(y), unit(z)] }
}

impl View {
    /// World direction of normalised image point (`u`, `v`) (`unproject_cv` at depth 1).
    pub fn unproject(&self, u: f64, v: f64) -> [f64; 3] {
        let c = [(u - 0.5) / FOCAL, (v - 0.5) / FOCAL, 1.0];
        let r = self.rotation;
        std::array::from_fn(|k| r[0][k] as f64 * c[0] + r[1][k] as f64 * c[1] + r[2][k] as f64 * c[2])
    }

    /// Normalised image point and depth of world direction `d` (`project_cv`).
    pub fn project(&self, d: [f64; 3]) -> (f64, f64, f64) {
        let p: [f64; 3] = std::array::from_fn(|k| self.rotation[k].iter().zip(&d).map(|(&r, &x)| r as f64 * x).sum());
        (FOCAL * p[0] / p[2] + 0.5, FOCAL * p[1] / p[2] + 0.5, p[2])
    }
}

/// `spherical_uv_to_directions`: θ = (1 − u)·2π, φ = v·π, (sin φ cos θ, sin φ sin θ, cos φ).
pub fn direction(u: f64, v: f64) -> [f64; 3] {
    let (theta, phi) = ((1.0 - u) * std::f64::consts::TAU, v * std::f64::consts::PI);
    [phi.sin() * theta.cos(), phi.sin() * theta.sin(), phi.cos()]
}

/// `directions_to_spherical_uv`: u = 1 − (atan2(y, x) / 2π mod 1), v = acos(z) / π.
pub fn spherical_uv(d: [f64; 3]) -> (f64, f64) {
    let n = (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt();
    let u = 1.0 - (d[1].atan2(d[0]) / std::f64::consts::TAU).rem_euclid(1.0);
    (u, (d[2] / n).clamp(-1.0, 1.0).acos() / std::f64::consts::PI)
}

/// One axis of utils3d's `uv_map`: pixel centres (i + 0.5) / n, numpy's float64 `linspace`
/// cast to float32.
pub fn centres(n: usize) -> Vec<f32> {
    let (start, end) = (0.5 / n as f64, 1.0 - 0.5 / n as f64);
    let step = if n > 1 { (end - start) / (n - 1) as f64 } else { 0.0 };
    (0..n).map(|i| if i + 1 == n && n > 1 { end as f32 } else { (start + step * i as f64) as f32 }).collect()
}

/// World directions (upstream's axes, z up) of an equirectangular grid's pixel centres, in
/// float32 as upstream computes them.
pub fn grid_directions(width: usize, height: usize) -> Vec<[f32; 3]> {
    let (us, vs) = (centres(width), centres(height));
    vs.iter().flat_map(|&v| us.iter().map(move |&u| direction(u as f64, v as f64).map(|c| c as f32))).collect()
}

/// moge's camera axes for a panorama's points (x right, y down, z forward, as every moge point
/// map), forward being the picture's centre column on the horizon: (x, y, z) = (y_w, −z_w, −x_w)
/// of upstream's world axes.
pub fn to_camera_axes(d: [f32; 3]) -> [f32; 3] {
    [d[1], -d[2], -d[0]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_view_is_a_rotation_whose_forward_is_its_vertex() {
        let vs = views();
        assert_eq!(vs.len(), 12);
        for v in &vs {
            let r = v.rotation;
            for i in 0..3 {
                for j in 0..3 {
                    let dot: f32 = (0..3).map(|k| r[i][k] * r[j][k]).sum();
                    assert!((dot - f32::from(i == j)).abs() < 1e-6, "{r:?}");
                }
            }
            // The centre of the view looks along its z row and projects back to the centre.
            let d = v.unproject(0.5, 0.5);
            let (u, w, depth) = v.project(d);
            assert!((u - 0.5).abs() < 1e-9 && (w - 0.5).abs() < 1e-9 && depth > 0.0);
            // Up in the world is up in the picture (y points down): the top edge looks higher.
            assert!(v.unproject(0.5, 0.0)[2] > v.unproject(0.5, 1.0)[2]);
        }
    }

    #[test]
    fn spherical_uv_inverts_direction_and_the_centre_column_is_forward() {
        for &(u, v) in &[(0.1, 0.2), (0.5, 0.5), (0.93, 0.71), (0.999, 0.01)] {
            let (u2, v2) = spherical_uv(direction(u, v));
            assert!((u2 - u).abs() < 1e-12 && (v2 - v).abs() < 1e-12, "{u} {v} -> {u2} {v2}");
        }
        let f = to_camera_axes(direction(0.5, 0.5).map(|c| c as f32));
        assert!((f[2] - 1.0).abs() < 1e-6 && f[0].abs() < 1e-6 && f[1].abs() < 1e-6);
        // Right of centre is +x, above the horizon is −y.
        assert!(to_camera_axes(direction(0.6, 0.5).map(|c| c as f32))[0] > 0.0);
        assert!(to_camera_axes(direction(0.5, 0.4).map(|c| c as f32))[1] < 0.0);
    }
}
