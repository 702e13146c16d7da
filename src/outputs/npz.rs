//! The npz layout of the seed system (`save_npz`): points f32 (H,W,3), depth f32 (H,W),
//! normal f32 (H,W,3) when present, mask u8 (H,W) 1 = valid, intrinsics f32 (3,3) normalised,
//! intrinsics_pixels f32 (3,3), metric_scale / fov_x / fov_y f32 scalars (degrees).

use std::path::Path;

use anyhow::Result;
use ndarray::{arr0, Array2, Array3};
use ndarray_npy::NpzWriter;

use super::write_atomic;
use crate::infer::Prediction;

pub fn write(path: &Path, p: &Prediction, compress: bool) -> Result<()> {
    write_atomic(path, |f| {
        let (h, w) = (p.height, p.width);
        let mut npz = if compress { NpzWriter::new_compressed(f) } else { NpzWriter::new(f) };
        npz.add_array("points", &Array3::from_shape_vec((h, w, 3), p.points.clone())?)?;
        npz.add_array("depth", &Array2::from_shape_vec((h, w), p.depth.clone())?)?;
        if let Some(n) = &p.normal {
            npz.add_array("normal", &Array3::from_shape_vec((h, w, 3), n.clone())?)?;
        }
        npz.add_array("mask", &Array2::from_shape_vec((h, w), p.mask.iter().map(|&m| m as u8).collect())?)?;
        let k = |m: [[f32; 3]; 3]| Array2::from_shape_fn((3, 3), |(i, j)| m[i][j]);
        npz.add_array("intrinsics", &k(p.intrinsics))?;
        npz.add_array("intrinsics_pixels", &k(p.intrinsics_pixels()))?;
        let (fx, fy) = p.fov_degrees();
        npz.add_array("metric_scale", &arr0(p.metric_scale))?;
        npz.add_array("fov_x", &arr0(fx))?;
        npz.add_array("fov_y", &arr0(fy))?;
        npz.finish()?;
        Ok(())
    })
}
