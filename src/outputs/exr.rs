//! OpenEXR maps as upstream writes them with OpenCV: float32, ZIP compression (16 scan
//! lines), +inf where invalid. `x.depth.exr` has one channel `Y`; `x.points.exr` has `R`, `G`,
//! `B` = x, y, z (camera axes: x right, y down, z forward).

use std::io::BufWriter;
use std::path::Path;

use anyhow::{anyhow, Result};
use exr::prelude::*;

use super::write_atomic;
use crate::infer::Prediction;

fn write_channels(path: &Path, w: usize, h: usize, channels: Vec<(&str, Vec<f32>)>) -> Result<()> {
    let list: SmallVec<[AnyChannel<FlatSamples>; 4]> = channels.into_iter().map(|(name, v)| AnyChannel::new(name, FlatSamples::F32(v))).collect();
    let layer = Layer::new((w, h), LayerAttributes::default(), Encoding::SMALL_LOSSLESS, AnyChannels::sort(list));
    let image = Image::from_layer(layer);
    write_atomic(path, |f| {
        image.write().to_buffered(BufWriter::new(f)).map_err(|e| match e {
            // Kept as an io::Error so that a full disk is recognised as fatal.
            exr::error::Error::Io(io) => anyhow::Error::new(io),
            other => anyhow!("OpenEXR: {other}"),
        })?;
        Ok(())
    })
}

pub fn write_depth(path: &Path, p: &Prediction) -> Result<()> {
    write_channels(path, p.width, p.height, vec![("Y", p.depth.clone())])
}

pub fn write_points(path: &Path, p: &Prediction) -> Result<()> {
    let c = |k: usize| p.points.iter().skip(k).step_by(3).copied().collect::<Vec<f32>>();
    write_channels(path, p.width, p.height, vec![("R", c(0)), ("G", c(1)), ("B", c(2))])
}
