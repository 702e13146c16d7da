//! The npz layout of the Tenstorrent MoGe-2 server (tt-MoGe, its `save_npz`): points f32 (H,W,3), depth f32 (H,W),
//! normal f32 (H,W,3) when present (or f16, [`NormalDtype`], as tt-MoGe sends it), mask u8
//! (H,W) 1 = valid, intrinsics f32 (3,3) normalised, intrinsics_pixels f32 (3,3), metric_scale /
//! fov_x / fov_y f32 scalars (degrees). MoGe-3 with each step's maps kept adds upstream's
//! `points_per_step` (S+1,H,W,3), `depth_per_step` (S+1,H,W), `intrinsics_per_step` (S+1,3,3)
//! and `mask_per_step` u8 (S+1,H,W), step 0 unrefined, the last the final maps.
//!
//! Each array is serialised as `.npy` by ndarray-npy and stored in the zip here, so that the
//! compression can be chosen ([`Compression`]); numpy (`np.load`) and any zip reader read every
//! choice.

use std::io::{BufWriter, Seek, Write};
use std::path::Path;

use anyhow::Result;
use ndarray::{arr0, Array2, ArrayView2, ArrayView3};
use ndarray_npy::WriteNpyExt;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

use super::{reserve, write_atomic};
use crate::infer::Prediction;

/// How the arrays are stored in the npz.
///
/// The default is `none`: at 1920x1080, deflate's fastest level spends ~380 ms of a core per
/// image on the 60 MB of float maps (to make them 36 MB), several times the rest of the host
/// work together, and would cap a fast device's throughput (PERFORMANCE.md, "Host stages").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Stored as they are (`np.savez`): the fastest to write and to read, the largest.
    #[default]
    None,
    /// Deflate level 1: float maps take several times less time than numpy's default level 6,
    /// at a small cost in size.
    Fast,
    /// Deflate level 9 (`np.savez_compressed` is level 6): the smallest, the slowest.
    Small,
}

/// The element type of `normal` in the npz; on the wire (`npz_normal_dtype`) by its lowercase
/// name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NormalDtype {
    /// IEEE half, rounded to nearest even as numpy's `astype(np.float16)`: the layout of the
    /// Tenstorrent MoGe-2 server (tt-MoGe), half the bytes (unit normals keep ~3 decimal digits).
    Float16,
    /// As upstream `infer()` returns it.
    #[default]
    Float32,
}

crate::names::names!(Compression, "npz compression", { None => "none", Fast => "fast", Small => "small" });

crate::names::names!(NormalDtype, "normal element type", { Float16 => "float16", Float32 => "float32" });

impl Compression {
    pub(crate) fn zip_options(self) -> SimpleFileOptions {
        let deflate = |level| SimpleFileOptions::default().compression_method(CompressionMethod::Deflated).compression_level(Some(level));
        match self {
            Compression::None => SimpleFileOptions::default().compression_method(CompressionMethod::Stored),
            Compression::Fast => deflate(1),
            Compression::Small => deflate(9),
        }
    }
}

pub fn write(path: &Path, p: &Prediction, compression: Compression, normal_dtype: NormalDtype) -> Result<()> {
    write_atomic(path, |f| {
        // A stored npz's size is known within a few headers: its blocks are reserved at once,
        // and what was not used is freed at the end.
        let reserved = (compression == Compression::None).then(|| stored_size_bound(p, normal_dtype));
        if let Some(len) = reserved {
            reserve(f, len)?;
        }
        let mut out = encode(BufWriter::with_capacity(1 << 20, &mut *f), p, compression, normal_dtype)?;
        out.flush()?;
        let end = out.stream_position()?;
        drop(out);
        if reserved.is_some() {
            f.set_len(end)?;
        }
        Ok(())
    })
}

/// At least the size of `p`'s stored npz: the arrays' bytes, and for each of the nine entries
/// its npy header (<= 128 bytes for these shapes), zip headers with Zip64 fields (< 256 for
/// these names), with the end records on top.
fn stored_size_bound(p: &Prediction, normal_dtype: NormalDtype) -> u64 {
    let n = (p.width * p.height) as u64;
    let normal = match (&p.normal, normal_dtype) {
        (None, _) => 0,
        (Some(_), NormalDtype::Float32) => 12 * n,
        (Some(_), NormalDtype::Float16) => 6 * n,
    };
    let steps = p.per_step.len() as u64;
    12 * n + 4 * n + normal + n + 2 * 36 + 3 * 4 + 9 * (128 + 256) + 1024 + steps * (17 * n + 36) + 4 * (128 + 256)
}

/// The npz of `p` into `out` (a file, or a `Cursor<Vec<u8>>` for an HTTP response); returns
/// `out` after the zip's central directory.
pub fn encode<W: Write + Seek>(out: W, p: &Prediction, compression: Compression, normal_dtype: NormalDtype) -> Result<W> {
    {
        let (h, w) = (p.height, p.width);
        let mut zip = ZipWriter::new(out);
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
            match normal_dtype {
                NormalDtype::Float32 => add("normal", 12 * h * w, &|z| ArrayView3::from_shape((h, w, 3), &n[..]).expect("normal is H x W x 3").write_npy(z))?,
                NormalDtype::Float16 => add("normal", 6 * h * w, &|z| write_npy_f16(z, &[h, w, 3], n).map_err(ndarray_npy::WriteNpyError::Io))?,
            }
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
        if !p.per_step.is_empty() {
            let s = p.per_step.len();
            let cat = |f: &dyn Fn(&Prediction) -> &[f32]| -> Vec<f32> { p.per_step.iter().flat_map(|q| f(q).iter().copied()).collect() };
            let points = cat(&|q| &q.points);
            add("points_per_step", 12 * s * h * w, &|z| ndarray::ArrayView4::from_shape((s, h, w, 3), &points[..]).expect("steps x H x W x 3").write_npy(z))?;
            let depth = cat(&|q| &q.depth);
            add("depth_per_step", 4 * s * h * w, &|z| ArrayView3::from_shape((s, h, w), &depth[..]).expect("steps x H x W").write_npy(z))?;
            let ks: Vec<f32> = p.per_step.iter().flat_map(|q| q.intrinsics.into_iter().flatten()).collect();
            add("intrinsics_per_step", 36 * s, &|z| ArrayView3::from_shape((s, 3, 3), &ks[..]).expect("steps x 3 x 3").write_npy(z))?;
            let masks: Vec<u8> = p.per_step.iter().flat_map(|q| q.mask.iter().map(|&m| m as u8)).collect();
            add("mask_per_step", s * h * w, &|z| ArrayView3::from_shape((s, h, w), &masks[..]).expect("steps x H x W").write_npy(z))?;
        }
        Ok(zip.finish()?)
    }
}

/// `.npy` (format 1.0) of `data` cast to float16, little-endian, C order: the one element type
/// ndarray-npy cannot write.
pub fn write_npy_f16(w: &mut impl Write, shape: &[usize], data: &[f32]) -> std::io::Result<()> {
    use half::slice::HalfFloatSliceExt;
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '<f2', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + length (2) + header + '\n', padded with spaces to 64 bytes.
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    header.extend(std::iter::repeat_n(' ', total - 10 - header.len() - 1));
    header.push('\n');
    w.write_all(b"\x93NUMPY\x01\x00")?;
    w.write_all(&(header.len() as u16).to_le_bytes())?;
    w.write_all(header.as_bytes())?;
    // In blocks, through half's vectorised conversion (F16C where the CPU has it).
    let mut halves = vec![half::f16::ZERO; data.len().min(1 << 16)];
    let mut bytes = Vec::with_capacity(2 * halves.len());
    for block in data.chunks(1 << 16) {
        let out = &mut halves[..block.len()];
        out.convert_from_f32_slice(block);
        bytes.clear();
        bytes.extend(out.iter().flat_map(|v| v.to_le_bytes()));
        w.write_all(&bytes)?;
    }
    Ok(())
}
