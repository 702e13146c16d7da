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
