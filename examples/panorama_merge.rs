//! The panorama merge alone, on view maps from a file: `scripts/bench-panorama.sh` writes the
//! twelve views' distances and masks of a synthetic room, runs upstream's
//! `merge_panorama_depth` on them and this on the same file, and compares the two maps.
//!
//! `cargo run --release --example panorama_merge -- VIEWS.npz OUT.npz [WIDTH HEIGHT]`
//! (VIEWS.npz: `distance` f32 (12, S, S), `mask` u8 (12, S, S); default 1920 x 960, upstream's
//! merge size from a 3840 x 1920 photo). Writes `distance` and `mask` of the merged map and
//! prints the time and LSMR's iterations per level.

use std::fs::File;
use std::time::Instant;

use anyhow::{Context, Result};
use ndarray::{Array2, Array3};
use ndarray_npy::{NpzReader, NpzWriter};

use moge::panorama::{cameras, lsmr, merge};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(input), Some(output)) = (args.first(), args.get(1)) else {
        anyhow::bail!("usage: panorama_merge VIEWS.npz OUT.npz [WIDTH HEIGHT]");
    };
    let width: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(1920);
    let height: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(960);
    let mut z = NpzReader::new(File::open(input).with_context(|| input.clone())?)?;
    let distance: Array3<f32> = z.by_name("distance.npy")?;
    let mask: Array3<u8> = z.by_name("mask.npy")?;
    let size = distance.shape()[1];
    let d = distance.as_standard_layout().into_owned().into_raw_vec_and_offset().0;
    let m: Vec<bool> = mask.iter().map(|&v| v != 0).collect();
    let views: Vec<merge::ViewDistance> =
        d.chunks(size * size).zip(m.chunks(size * size)).map(|(distance, mask)| merge::ViewDistance { size, distance, mask }).collect();
    let cams = cameras::views();
    let started = Instant::now();
    let merged = merge::merge(width, height, &cams, &views, &lsmr::Stop::UPSTREAM)?;
    let secs = started.elapsed().as_secs_f64();
    println!("moge merge {width}x{height}: {secs:.2} s, LSMR iterations {:?}", merged.iterations);
    let mut w = NpzWriter::new(File::create(output)?);
    w.add_array("distance", &Array2::from_shape_vec((height, width), merged.distance)?)?;
    w.add_array("mask", &Array2::from_shape_vec((height, width), merged.mask.iter().map(|&b| u8::from(b)).collect())?)?;
    w.finish()?;
    Ok(())
}
