//! CUDA graphs: the forward of each token grid is captured once and replayed for every
//! image of that grid, so the ~thousand kernel launches of a forward cost one launch.
//!
//! A capture records what the stream does, addresses included, so the graph reads its inputs from
//! buffers that stay put (the image and the UV planes, written before each replay) and writes to
//! outputs that stay put (kept by [`Captured`]). What breaks a capture: uploads (the network takes
//! device-resident inputs; candle's small shape/stride uploads come from its cache, filled by a
//! warm-up on the same thread), reads back, the first load of a kernel module. Every failure is
//! reported once and the grid runs op by op from then on; so is a replay whose outputs differ
//! from the op-by-op forward it was captured after.
//!
//! `MOGE_CUDA_GRAPHS=0` turns replay off (for measuring the op-by-op forward).

use std::sync::Mutex;

use lru::LruCache;

use anyhow::{anyhow, bail, Result};
use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph, CudaStream};
use candle_core::{Device, Tensor};

use super::v2::{Model, Outputs, Prepared, RawOutput};

/// The graphs of one model, for the last [`super::v2::GRIDS_CACHED`] token grids used (an
/// evicted grid's graph and buffers are freed, and captured again if it comes back).
pub(crate) struct Graphs {
    by_grid: Mutex<LruCache<(usize, usize), Entry>>,
}

/// How the forwards ran, for `moge bench` and the sidecar.
pub(crate) fn describe(graphs: &Graphs, device: &Device) -> Option<String> {
    if !device.is_cuda() {
        return None;
    }
    if !enabled() {
        return Some("off (MOGE_CUDA_GRAPHS=0)".into());
    }
    let by_grid = graphs.by_grid.lock().unwrap_or_else(|p| p.into_inner());
    let mut grids: Vec<String> = by_grid
        .iter()
        .map(|((r, c), e)| match e {
            Entry::Ready(_) => format!("{r}x{c} replayed"),
            Entry::Failed(why) => format!("{r}x{c} op by op ({why})"),
        })
        .collect();
    grids.sort();
    Some(if grids.is_empty() { "on (nothing captured yet)".into() } else { format!("on: {}", grids.join("; ")) })
}

enum Entry {
    Ready(Box<Captured>),
    /// The capture or a replay failed (why): this grid runs op by op.
    Failed(String),
}

struct Captured {
    graph: CudaGraph,
    image: Tensor,
    uv: Vec<Tensor>,
    /// The aspect the UV planes hold now (they are written again only when it changes).
    aspect: f64,
    outputs: Outputs,
}

// SAFETY: the graph is only touched under the `by_grid` mutex (cudarc's `CudaGraph` is not
// thread-safe, but nothing in it is tied to the thread that made it); tensors are Send + Sync.
unsafe impl Send for Captured {}

/// Whether replay is on (`MOGE_CUDA_GRAPHS` unset, or anything but 0/off/false).
pub(crate) fn enabled() -> bool {
    !matches!(std::env::var("MOGE_CUDA_GRAPHS").as_deref(), Ok("0") | Ok("off") | Ok("false"))
}

impl Graphs {
    pub fn new() -> Self {
        Self { by_grid: Mutex::new(LruCache::new(super::v2::GRIDS_CACHED)) }
    }

    /// The forward by graph replay; `None` where it does not apply (not CUDA, turned off, or the
    /// capture of this grid failed), and the caller runs the forward op by op.
    pub fn forward(&self, model: &Model, prep: &Prepared) -> Result<Option<RawOutput>> {
        let Device::Cuda(cuda) = &model.device else { return Ok(None) };
        if !enabled() {
            return Ok(None);
        }
        let (rows, cols) = prep.grid;
        let mut by_grid = self.by_grid.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = by_grid.get_mut(&prep.grid) else {
            return Ok(match capture(model, &cuda.cuda_stream(), prep) {
                Ok((c, raw)) => {
                    by_grid.put(prep.grid, Entry::Ready(Box::new(c)));
                    // The capture's own op-by-op run is this image's answer.
                    Some(raw)
                }
                Err(e) => {
                    eprintln!("moge: CUDA graph for the {rows}x{cols} token grid not used: {e:#}; running op by op");
                    by_grid.put(prep.grid, Entry::Failed(format!("{e:#}")));
                    None
                }
            });
        };
        let Entry::Ready(c) = entry else { return Ok(None) };
        match replay(model, c, prep) {
            Ok(raw) => Ok(Some(raw)),
            Err(e) => {
                eprintln!("moge: CUDA graph replay failed for the {rows}x{cols} token grid: {e:#}; running op by op");
                *entry = Entry::Failed(format!("replay: {e:#}"));
                Ok(None)
            }
        }
    }
}

fn aspect(prep: &Prepared) -> f64 {
    prep.width as f64 / prep.height as f64
}

/// Warm-up op by op (kernels loaded, candle's upload cache filled), capture, one replay checked
/// against the warm-up's outputs. Returns the graph and the warm-up's outputs.
fn capture(model: &Model, stream: &std::sync::Arc<CudaStream>, prep: &Prepared) -> Result<(Captured, RawOutput)> {
    let Device::Cuda(cuda) = &model.device else { bail!("not a CUDA device") };
    let (image, uv) = model.device_inputs(prep)?;
    let pos_embed = model.pos_embed(prep.grid.0, prep.grid.1)?;
    let _cache = cuda.enable_cuda_graph_htod_cache();
    let eager = model.network(&image, &uv, &pos_embed, prep.grid, None)?.read_back()?;
    model.device.synchronize()?;

    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(|e| anyhow!("begin capture: {e}"))?;
    // Only the outputs outlive the capture: every intermediate is freed inside the graph.
    let captured = model.network(&image, &uv, &pos_embed, prep.grid, None).map(|net| net.outputs());
    // The capture is ended whatever happened, or the stream stays unusable.
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    let outputs = captured?;
    let graph = graph.map_err(|e| anyhow!("end capture: {e}"))?.ok_or_else(|| anyhow!("the capture recorded nothing"))?;
    graph.upload().map_err(|e| anyhow!("graph upload: {e}"))?;
    let c = Captured { graph, image, uv, aspect: aspect(prep), outputs };

    graph_launch(&c)?;
    let replayed = c.outputs.read_back()?;
    check_same(&eager, &replayed)?;
    Ok((c, eager))
}

fn graph_launch(c: &Captured) -> Result<()> {
    c.graph.launch().map_err(|e| anyhow!("graph launch: {e}"))
}

/// Writes this image (and its UV planes where the aspect changed) into the graph's inputs,
/// replays, reads the outputs back.
fn replay(model: &Model, c: &mut Captured, prep: &Prepared) -> Result<RawOutput> {
    c.image.slice_set(&model.device_image(prep)?, 0, 0)?;
    if aspect(prep) != c.aspect {
        for (dst, src) in c.uv.iter().zip(&model.device_uv(prep)?) {
            dst.slice_set(src, 0, 0)?;
        }
        c.aspect = aspect(prep);
    }
    graph_launch(c)?;
    c.outputs.read_back()
}

/// A replay computes what the op-by-op forward computed, kernel for kernel: anything beyond
/// rounding noise means the capture went wrong.
fn check_same(eager: &RawOutput, replayed: &RawOutput) -> Result<()> {
    let pairs = [
        ("points", Some(&eager.points), Some(&replayed.points)),
        ("normal", eager.normal.as_ref(), replayed.normal.as_ref()),
        ("mask", eager.mask.as_ref(), replayed.mask.as_ref()),
    ];
    for (name, a, b) in pairs {
        let (Some(a), Some(b)) = (a, b) else { continue };
        if a.len() != b.len() {
            bail!("the replayed {name} has {} values, the forward {}", b.len(), a.len());
        }
        let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) });
        if !(worst <= 1e-3 * scale) {
            bail!("the replayed {name} differs from the forward by {worst} (largest value {scale})");
        }
    }
    if let (Some(a), Some(b)) = (eager.metric_scale, replayed.metric_scale) {
        if !((a - b).abs() <= 1e-3 * a.abs().max(1e-6)) {
            bail!("the replayed scale {b} differs from the forward's {a}");
        }
    }
    Ok(())
}
