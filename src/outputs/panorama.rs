//! A panorama's files (`moge panorama`): the formats of a photo's where they apply to an
//! equirectangular map, with the panorama's own npz and sidecar.
//!
//! - `x.npz`: points f32 (H,W,3) in moge's camera axes (forward = the picture's centre column),
//!   depth f32 (H,W) = distance from the centre, mask u8 (H,W), metric_scale f32 (the factor
//!   carried into the merged map), view_metric_scale f32 (12,) (each view's scale head); no
//!   intrinsics or field of view (an equirectangular picture has none).
//! - `x.json` (with json or png): size, projection, metric scale, the views, the merge, depth
//!   statistics, the depth PNG's scale.
//! - exr, png (depth and mask), vis (depth), ply and glb (an equirectangular mesh, y up) as for
//!   a photo; the mesh drops the pixels upstream's does (`panorama::edges`: where the distance
//!   jumps and the surface turns, `--edge-rtol` default 0.03 as upstream's `--threshold`).

use std::io::{BufWriter, Seek, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use image::RgbImage;
use ndarray::{arr0, ArrayView1, ArrayView2, ArrayView3};
use ndarray_npy::WriteNpyExt;
use serde_json::json;
use zip::ZipWriter;

use super::npz::Compression;
use super::{edges, exr, glb, json::DepthStats, ply, png, vis, with_suffix, write_atomic, Format, OutputOptions};
use crate::panorama::Panorama;

/// The suffixes of the files [`write`] makes for `opts`, in its order (`--skip-existing`).
pub fn suffixes(opts: &OutputOptions) -> Vec<&'static str> {
    let mut out = Vec::new();
    let table: [(Format, &[&'static str]); 6] = [
        (Format::Npz, &["npz"]),
        (Format::Png, &["depth.png", "mask.png"]),
        (Format::Exr, &["depth.exr", "points.exr"]),
        (Format::Vis, &["depth_vis.png"]),
        (Format::Ply, &["ply"]),
        (Format::Glb, &["glb"]),
    ];
    for (format, names) in table {
        if opts.wants(format) {
            out.extend_from_slice(names);
        }
    }
    if opts.wants_sidecar() {
        out.push("json");
    }
    out
}

/// Writes the formats `opts` asks for (mp4 does not apply) beside `stem`; returns the files.
pub fn write(stem: &Path, pano: &Panorama, image: &RgbImage, opts: &OutputOptions) -> Result<Vec<PathBuf>> {
    let p = &pano.prediction;
    let mut written = Vec::new();
    let mut file = |suffix: &str, write: &mut dyn FnMut(&Path) -> Result<()>| -> Result<()> {
        let path = with_suffix(stem, suffix);
        write(&path).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    if opts.wants(Format::Npz) {
        file("npz", &mut |path| write_npz(path, pano, opts))?;
    }
    let mut saturated = 0;
    if opts.wants(Format::Png) {
        file("depth.png", &mut |path| {
            saturated = png::write_depth(path, p, opts.depth_png_scale)?;
            Ok(())
        })?;
        file("mask.png", &mut |path| png::write_mask(path, p))?;
    }
    if opts.wants(Format::Exr) {
        file("depth.exr", &mut |path| exr::write_depth(path, p))?;
        file("points.exr", &mut |path| exr::write_points(path, p))?;
    }
    if opts.wants(Format::Vis) {
        file("depth_vis.png", &mut |path| vis::write_depth(path, p))?;
    }
    if opts.wants(Format::Ply) || opts.wants(Format::Glb) {
        let keep = crate::panorama::edges::mesh_mask(&pano.distance, &p.mask, p.width, p.height, opts.edge_rtol);
        let s = edges::Surface::from_mask(p, image, &keep);
        if opts.wants(Format::Ply) {
            file("ply", &mut |path| ply::write(path, &s))?;
        }
        if opts.wants(Format::Glb) {
            file("glb", &mut |path| glb::write(path, &s, image))?;
        }
    }
    if opts.wants_sidecar() {
        file("json", &mut |path| {
            let body = serde_json::to_vec_pretty(&sidecar(pano, opts, saturated))?;
            write_atomic(path, |f| Ok(f.write_all(&body)?))
        })?;
    }
    Ok(written)
}

fn write_npz(path: &Path, pano: &Panorama, opts: &OutputOptions) -> Result<()> {
    write_atomic(path, |f| {
        encode_npz(BufWriter::with_capacity(1 << 20, f), pano, opts.npz_compression)?.flush()?;
        Ok(())
    })
}

/// The panorama's npz into `out` (a file, or a `Cursor<Vec<u8>>` for an HTTP answer).
pub fn encode_npz<W: Write + Seek>(out: W, pano: &Panorama, compression: Compression) -> Result<W> {
    let p = &pano.prediction;
    let (h, w) = (p.height, p.width);
    let options = compression.zip_options().large_file(12 * (h * w) as u64 + 256 >= u32::MAX as u64);
    let mut zip = ZipWriter::new(out);
    zip.start_file("points.npy", options)?;
    ArrayView3::from_shape((h, w, 3), &p.points[..])?.write_npy(&mut zip)?;
    zip.start_file("depth.npy", options)?;
    ArrayView2::from_shape((h, w), &p.depth[..])?.write_npy(&mut zip)?;
    let mask: Vec<u8> = p.mask.iter().map(|&m| u8::from(m)).collect();
    zip.start_file("mask.npy", options)?;
    ArrayView2::from_shape((h, w), &mask[..])?.write_npy(&mut zip)?;
    zip.start_file("metric_scale.npy", options)?;
    arr0(p.metric_scale).write_npy(&mut zip)?;
    zip.start_file("view_metric_scale.npy", options)?;
    ArrayView1::from(&pano.view_metric_scales[..]).write_npy(&mut zip)?;
    Ok(zip.finish()?)
}

fn sidecar(pano: &Panorama, opts: &OutputOptions, saturated: usize) -> serde_json::Value {
    let p = &pano.prediction;
    json!({
        "width": p.width,
        "height": p.height,
        "projection": "equirectangular",
        "axes": "x right, y down, z forward (the picture's centre column on the horizon); depth is the distance from the centre",
        "metric_scale": p.metric_scale,
        "views": {
            "count": pano.view_metric_scales.len(),
            "fov_degrees": crate::panorama::cameras::VIEW_FOV_DEGREES,
            "metric_scale": pano.view_metric_scales,
        },
        "merge": { "width": pano.merge_size.0, "height": pano.merge_size.1, "lsmr_iterations": pano.iterations, "ms": pano.merge_ms },
        "depth": DepthStats::of(p),
        "depth_png": { "scale": opts.depth_png_scale, "saturated": saturated },
    })
}
