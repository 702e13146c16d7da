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
use ndarray::{arr0, Array2, Array3};
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
        let mut add = |name: &str, npy: Vec<u8>| -> Result<()> {
            let opts = compression.zip_options();
            // Zip64 only where needed (arrays of 4 GiB), so small files stay plain zip.
            zip.start_file(format!("{name}.npy"), opts.large_file(npy.len() as u64 >= u32::MAX as u64))?;
            zip.write_all(&npy)?;
            Ok(())
        };
        let npy = |a: &dyn Fn(&mut Vec<u8>) -> Result<(), ndarray_npy::WriteNpyError>| -> Result<Vec<u8>> {
            let mut v = Vec::new();
            a(&mut v)?;
            Ok(v)
        };
        add("points", npy(&|v| Array3::from_shape_vec((h, w, 3), p.points.clone()).unwrap().write_npy(v))?)?;
        add("depth", npy(&|v| Array2::from_shape_vec((h, w), p.depth.clone()).unwrap().write_npy(v))?)?;
        if let Some(n) = &p.normal {
            add("normal", npy(&|v| Array3::from_shape_vec((h, w, 3), n.clone()).unwrap().write_npy(v))?)?;
        }
        let mask: Vec<u8> = p.mask.iter().map(|&m| m as u8).collect();
        add("mask", npy(&|v| Array2::from_shape_vec((h, w), mask.clone()).unwrap().write_npy(v))?)?;
        let k = |m: [[f32; 3]; 3]| Array2::from_shape_fn((3, 3), |(i, j)| m[i][j]);
        add("intrinsics", npy(&|v| k(p.intrinsics).write_npy(v))?)?;
        add("intrinsics_pixels", npy(&|v| k(p.intrinsics_pixels()).write_npy(v))?)?;
        let (fx, fy) = p.fov_degrees();
        add("metric_scale", npy(&|v| arr0(p.metric_scale).write_npy(v))?)?;
        add("fov_x", npy(&|v| arr0(fx).write_npy(v))?)?;
        add("fov_y", npy(&|v| arr0(fy).write_npy(v))?)?;
        zip.finish()?.flush()?;
        Ok(())
    })
}
