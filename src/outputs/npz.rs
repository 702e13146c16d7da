//! The npz layout of the seed system (`save_npz`): points f32 (H,W,3), depth f32 (H,W),
//! normal f32 (H,W,3) when present, mask u8 (H,W) 1 = valid, intrinsics f32 (3,3) normalised,
//! intrinsics_pixels f32 (3,3), metric_scale / fov_x / fov_y f32 scalars (degrees).
//!
//! Each array is serialised as `.npy` by ndarray-npy and stored in the zip here, so that the
//! compression can be chosen ([`Compression`]); numpy (`np.load`) and any zip reader read every
//! choice.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Result;
use ndarray::{arr0, Array2, ArrayView2, ArrayView3};
use ndarray_npy::WriteNpyExt;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

use super::write_atomic;
use crate::infer::Prediction;

/// How the arrays are stored in the npz.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Compression {
    /// Stored as they are (`np.savez`): the fastest to write and to read, the largest.
    None,
    /// Deflate level 1: float maps take several times less time than numpy's default level 6,
    /// at a small cost in size.
    #[default]
    Fast,
    /// Deflate level 9 (`np.savez_compressed` is level 6): the smallest, the slowest.
    Small,
}

impl Compression {
    fn zip_options(self) -> SimpleFileOptions {
        let deflate = |level| SimpleFileOptions::default().compression_method(CompressionMethod::Deflated).compression_level(Some(level));
        match self {
            Compression::None => SimpleFileOptions::default().compression_method(CompressionMethod::Stored),
            Compression::Fast => deflate(1),
            Compression::Small => deflate(9),
        }
    }
}

pub fn write(path: &Path, p: &Prediction, compression: Compression) -> Result<()> {
    write_atomic(path, |f| {
        let (h, w) = (p.height, p.width);
        let mut zip = ZipWriter::new(BufWriter::with_capacity(1 << 20, f));
        let opts = compression.zip_options();
        // Each array is written by ndarray-npy straight into its zip entry from a view of the
        // prediction's buffer (no copy); Zip64 only where needed (arrays of 4 GiB), so small
        // files stay plain zip.
        let mut add = |name: &str, bytes: usize, write: &dyn Fn(&mut ZipWriter<_>) -> Result<(), ndarray_npy::WriteNpyError>| -> Result<()> {
            zip.start_file(format!("{name}.npy"), opts.large_file(bytes as u64 + 256 >= u32::MAX as u64))?;
            write(&mut zip)?;
            Ok(())
        };
        add("points", 12 * h * w, &|z| ArrayView3::from_shape((h, w, 3), &p.points[..]).expect("points are H x W x 3").write_npy(z))?;
        add("depth", 4 * h * w, &|z| ArrayView2::from_shape((h, w), &p.depth[..]).expect("depth is H x W").write_npy(z))?;
        if let Some(n) = &p.normal {
            add("normal", 12 * h * w, &|z| ArrayView3::from_shape((h, w, 3), &n[..]).expect("normal is H x W x 3").write_npy(z))?;
        }
        let mask: Vec<u8> = p.mask.iter().map(|&m| m as u8).collect();
        add("mask", h * w, &|z| ArrayView2::from_shape((h, w), &mask[..]).expect("mask is H x W").write_npy(z))?;
        let k = |m: [[f32; 3]; 3]| Array2::from_shape_fn((3, 3), |(i, j)| m[i][j]);
        add("intrinsics", 36, &|z| k(p.intrinsics).write_npy(z))?;
        add("intrinsics_pixels", 36, &|z| k(p.intrinsics_pixels()).write_npy(z))?;
        let (fx, fy) = p.fov_degrees();
        add("metric_scale", 4, &|z| arr0(p.metric_scale).write_npy(z))?;
        add("fov_x", 4, &|z| arr0(fx).write_npy(z))?;
        add("fov_y", 4, &|z| arr0(fy).write_npy(z))?;
        zip.finish()?.flush()?;
        Ok(())
    })
}
