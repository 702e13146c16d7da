//! The server's state: what is fixed for its life, the model resident with its device worker,
//! and the phases a cluster probes (loading, warming up, ready, stopping).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Semaphore};

use super::error::ApiError;
use super::metrics::Metrics;
use crate::fit::Canvas;
use crate::image_io::DecodeOptions;
use crate::model::v2::Model;
use crate::model::{RawOutput, Runner};
use crate::outputs::npz::Compression;
use crate::pipeline::plan::{self, ms, Placed, Plan};
use crate::pipeline::worker::{self, Worker};
use crate::protocol::PredictOptions;

/// What is fixed for the server's life.
#[derive(Debug, Clone)]
pub struct Config {
    /// The model's name in `/info`, and its checkpoint (digested for `/info`).
    pub model_id: String,
    pub weights: PathBuf,
    pub decode: DecodeOptions,
    /// The canvas of `fit: pad | stretch`.
    pub canvas: Canvas,
    pub depth_png_scale: f32,
    pub npz_compression: Compression,
    /// Host threads for decoding and for encoding, each.
    pub jobs: usize,
    /// Requests in progress at most (decoding, waiting, on the device, encoding).
    pub queue: usize,
    /// Largest request body.
    pub max_body: usize,
    /// How long a request's body may take to arrive.
    pub body_timeout: Duration,
    pub max_tokens: u32,
}

/// A request on its way through the device worker; the answer goes back on `reply`.
pub(super) struct DeviceJob {
    pub(super) placed: Placed,
    pub(super) reply: oneshot::Sender<(Placed, anyhow::Result<(RawOutput, f64)>)>,
}

pub struct Shared {
    pub(super) model: Arc<Model>,
    pub(super) worker: Worker<DeviceJob>,
    pub(super) cfg: Config,
    pub(super) admit: Arc<Semaphore>,
    pub(super) decoders: Arc<Semaphore>,
    pub(super) encoders: Arc<Semaphore>,
    pub(super) sha: Arc<OnceLock<String>>,
    pub(super) device: String,
}

impl Shared {
    /// Starts the device worker; the weights are digested in the background for `/info`.
    pub fn new(model: Arc<Model>, cfg: Config) -> Arc<Self> {
        let queue = cfg.queue.max(1);
        // Admission bounds the requests in progress, so the worker's queue never refuses one.
        let worker = {
            let runner = Runner::new(model.clone());
            Worker::spawn("moge-device", 1, queue, move |job: DeviceJob| {
                let out = worker::forward(&runner, &job.placed.prep);
                // The client may have gone: then nobody waits for the answer.
                let _ = job.reply.send((job.placed, out));
            })
        };
        let sha = Arc::new(OnceLock::new());
        {
            let (sha, path) = (sha.clone(), cfg.weights.clone());
            std::thread::spawn(move || {
                sha.get_or_init(|| crate::hub::digest_or_reason(&path));
            });
        }
        let device = crate::device::name_of(&model.device);
        Arc::new(Shared {
            worker,
            admit: Arc::new(Semaphore::new(queue)),
            decoders: Arc::new(Semaphore::new(cfg.jobs.max(1))),
            encoders: Arc::new(Semaphore::new(cfg.jobs.max(1))),
            model,
            cfg,
            sha,
            device,
        })
    }

    /// Waits until every request already with the device worker has had its forward.
    pub fn close(&self) {
        self.worker.close();
    }
}

/// Where the server is in its life; only `Ready` takes predictions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Loading = 0,
    WarmingUp = 1,
    Ready = 2,
    Stopping = 3,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Loading => "loading",
            Phase::WarmingUp => "warming up",
            Phase::Ready => "ok",
            Phase::Stopping => "stopping",
        }
    }
}

/// The server from its first moment: the model once loaded, its phase and its metrics.
pub struct Service {
    phase: AtomicU8,
    pub(super) loaded: OnceLock<Arc<Shared>>,
    pub metrics: Metrics,
}

impl Service {
    /// A server with no model yet: `/health` answers 503 and `/predict` is refused.
    pub fn new() -> Arc<Self> {
        Arc::new(Service { phase: AtomicU8::new(Phase::Loading as u8), loaded: OnceLock::new(), metrics: Metrics::default() })
    }

    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::SeqCst) {
            0 => Phase::Loading,
            1 => Phase::WarmingUp,
            2 => Phase::Ready,
            _ => Phase::Stopping,
        }
    }

    /// Moves from `from` to `to`; a server that is stopping stays so.
    fn advance(&self, from: Phase, to: Phase) {
        if self.phase.compare_exchange(from as u8, to as u8, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            self.metrics.set_ready(to == Phase::Ready);
        }
    }

    /// The model is loaded: starts its device worker. Not ready until [`Service::ready`].
    pub fn load(&self, model: Arc<Model>, cfg: Config) {
        if self.loaded.set(Shared::new(model, cfg)).is_ok() {
            self.advance(Phase::Loading, Phase::WarmingUp);
        }
    }

    /// One request's work (decode aside) on an image of the canvas's size with a request's
    /// default options, on the device worker, so that the first request is not the one that
    /// pays for the first forward (kernels chosen, buffers and caches made). Its milliseconds.
    pub fn warm_up(&self) -> anyhow::Result<f64> {
        use anyhow::Context;
        let st = self.loaded.get().context("warm-up before the model is loaded")?;
        let infer = PredictOptions::default().infer_options().map_err(anyhow::Error::msg)?;
        let plan = Plan { infer, fit: crate::fit::FitMode::Exact, canvas: st.cfg.canvas, ..Plan::default() };
        let (w, h) = (st.cfg.canvas.width, st.cfg.canvas.height);
        let photo = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, 128]));
        let t = Instant::now();
        let placed = plan::prepare(&st.model, &photo, &plan)?;
        let (tx, rx) = oneshot::channel();
        st.worker.submit(DeviceJob { placed, reply: tx }).map_err(|_| anyhow::anyhow!("the device worker stopped"))?;
        let (placed, out) = rx.blocking_recv().context("the device worker stopped")?;
        let (raw, _) = out?;
        let _ = plan::finish(&st.model, &placed, &raw, &plan);
        Ok(ms(t))
    }

    /// From now on `/health` answers 200 and predictions are taken.
    pub fn ready(&self) {
        if self.loaded.get().is_some() {
            self.advance(Phase::WarmingUp, Phase::Ready);
        }
    }

    /// Stops taking predictions (`/health` answers 503), for a graceful stop.
    pub fn stopping(&self) {
        self.phase.store(Phase::Stopping as u8, Ordering::SeqCst);
        self.metrics.set_ready(false);
    }

    /// Waits until every request already with the device worker has had its forward.
    pub fn close(&self) {
        self.stopping();
        if let Some(st) = self.loaded.get() {
            st.close();
        }
    }

    /// The loaded server, when it takes predictions.
    pub(super) fn serving(&self) -> Result<&Arc<Shared>, ApiError> {
        match (self.phase(), self.loaded.get()) {
            (Phase::Ready, Some(st)) => Ok(st),
            (phase, _) => Err(ApiError::busy(format!("not ready: {}", phase.name()))),
        }
    }
}
