//! Host-side numerics that must match PyTorch's float32 kernels closely: resizes, the UV plane,
//! `linspace`, the focal/shift solve of `recover_focal_shift`, libm's `expf` vectorised, the
//! 8-bit codes of unit normals, the meshes' depth-edge test, and OpenCV's `remap` (the panoramas'
//! views).

pub mod codes;
pub mod edges;
pub mod exp;
pub mod focal_shift;
pub mod remap;
pub mod resize;
pub mod uv;

/// numpy's median (the mean of the two middle values of an even count); NaN for none.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
