//! `moge serve`: the model resident behind the HTTP API of the Tenstorrent MoGe-2 server
//! (tt-MoGe): `POST /predict`, `GET /health`, `GET /info`.
//!
//! A request goes through the stages of `moge batch`: decode and prepare on a host thread,
//! the forward on the one device worker ([`crate::pipeline::worker`]), post-process and encode
//! on a host thread, so that with several clients the device never waits for host work.
//! Admission is bounded: past `queue` requests in progress the answer is 503 with
//! `Retry-After`, never more memory.
//!
//! For a cluster: the server listens while the model loads, so that `GET /health/live`
//! (liveness) answers at once, while `GET /health` (readiness) answers 503 until the model is
//! loaded and, if asked, warmed up by one forward ([`Service::warm_up`]), and again once it is
//! stopping; `GET /metrics` is in the Prometheus text format ([`metrics`]).

pub mod metrics;
pub mod request;
pub mod response;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use tokio::sync::{oneshot, Semaphore};

use crate::fit::Canvas;
use crate::image_io::DecodeOptions;
use crate::model::v2::Model;
use crate::model::{RawOutput, Runner};
use crate::outputs::json::DepthStats;
use crate::outputs::npz::Compression;
use crate::pipeline::guard::catch;
use crate::pipeline::stages::{self, ms, Plan, Staged};
use crate::pipeline::worker::{self, Refused, Worker};
use crate::protocol::{OutputFormat, PredictOptions};
use metrics::Metrics;
use response::{Meta, JSON_MAX_PIXELS};

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

/// An error answer: a status and a JSON `{"error": ...}` naming the problem.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), retry_after: None }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
    fn busy(message: impl Into<String>) -> Self {
        Self { retry_after: Some(1), ..Self::new(StatusCode::SERVICE_UNAVAILABLE, message) }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(json!({ "error": self.message }))).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// A request on its way through the device worker; the answer goes back on `reply`.
struct DeviceJob {
    staged: Staged,
    reply: oneshot::Sender<(Staged, anyhow::Result<(RawOutput, f64)>)>,
}

pub struct Shared {
    model: Arc<Model>,
    worker: Worker<DeviceJob>,
    cfg: Config,
    admit: Arc<Semaphore>,
    decoders: Arc<Semaphore>,
    encoders: Arc<Semaphore>,
    sha: Arc<OnceLock<String>>,
    device: String,
}

impl Shared {
    /// Starts the device worker; the weights are digested in the background for `/info`.
    pub fn new(model: Arc<Model>, cfg: Config) -> Arc<Self> {
        let queue = cfg.queue.max(1);
        // Admission bounds the requests in progress, so the worker's queue never refuses one.
        let worker = {
            let runner = Runner::new(model.clone());
            Worker::spawn("moge-device", 1, queue, move |job: DeviceJob| {
                let out = worker::forward(&runner, &job.staged.prep);
                // The client may have gone: then nobody waits for the answer.
                let _ = job.reply.send((job.staged, out));
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
    loaded: OnceLock<Arc<Shared>>,
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
        let staged = stages::prepare(&st.model, &photo, &plan)?;
        let (tx, rx) = oneshot::channel();
        st.worker.submit(DeviceJob { staged, reply: tx }).map_err(|_| anyhow::anyhow!("the device worker stopped"))?;
        let (staged, out) = rx.blocking_recv().context("the device worker stopped")?;
        let (raw, _) = out?;
        let _ = stages::finish(&st.model, &staged, &raw, &plan);
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
    fn serving(&self) -> Result<&Arc<Shared>, ApiError> {
        match (self.phase(), self.loaded.get()) {
            (Phase::Ready, Some(st)) => Ok(st),
            (phase, _) => Err(ApiError::busy(format!("not ready: {}", phase.name()))),
        }
    }
}

/// The routes, on `state` (tests drive this without a socket).
pub fn app(state: Arc<Service>) -> Router {
    Router::new()
        .route("/predict", post(predict))
        .route("/health", get(health))
        .route("/health/live", get(live))
        .route("/metrics", get(metrics))
        .route("/info", get(info))
        // tt-MoGe's stub, so that tools which probe an OpenAI-style server find something.
        .route("/v1/models", get(models))
        .with_state(state)
}

/// Readiness: 200 once predictions are taken, 503 with Retry-After before and while stopping.
async fn health(State(sv): State<Arc<Service>>) -> Response {
    let phase = sv.phase();
    let body = axum::Json(json!({ "status": phase.name() }));
    if phase == Phase::Ready {
        return body.into_response();
    }
    (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, HeaderValue::from(1))], body).into_response()
}

/// Liveness: 200 whenever the server answers at all.
async fn live(State(sv): State<Arc<Service>>) -> Response {
    axum::Json(json!({ "status": "alive", "phase": sv.phase().name() })).into_response()
}

async fn metrics(State(sv): State<Arc<Service>>) -> Response {
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], sv.metrics.render()).into_response()
}

async fn info(State(sv): State<Arc<Service>>) -> Response {
    let Some(st) = sv.loaded.get() else {
        return ApiError::busy("not ready: loading").into_response();
    };
    let m = &st.model;
    axum::Json(json!({
        "server": "moge",
        "output_formats": ["npz_binary", "npz", "png", "json"],
        "npz_normal_dtypes": crate::outputs::npz::NormalDtype::NAMES,
        "model": st.cfg.model_id,
        "variant": m.config.encoder.backbone,
        "precision": format!("{:?}", m.precision).to_lowercase(),
        "device": st.device,
        "version": env!("CARGO_PKG_VERSION"),
        "weights_sha256": st.sha.get(),
        "has_normal": m.has_normal(),
        "cached_grids": m.cached_grids(),
        "num_tokens_range": m.config.num_tokens_range,
        "max_tokens": st.cfg.max_tokens,
        "jobs": st.cfg.jobs,
        "queue": st.cfg.queue,
        "max_body_bytes": st.cfg.max_body,
    }))
    .into_response()
}

async fn models(State(sv): State<Arc<Service>>) -> Response {
    let id = sv.loaded.get().map(|st| st.cfg.model_id.as_str()).unwrap_or("loading");
    axum::Json(json!({ "object": "list", "data": [{ "id": id, "object": "model", "owned_by": "moge" }] })).into_response()
}

async fn predict(State(sv): State<Arc<Service>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Response {
    let started = Instant::now();
    let answer = match sv.serving() {
        Ok(st) => predict_inner(st, &sv.metrics, &headers, query.as_deref(), body, started).await,
        Err(e) => Err(e),
    };
    let response = answer.unwrap_or_else(IntoResponse::into_response);
    sv.metrics.answered(response.status().as_u16(), started.elapsed().as_secs_f64());
    response
}

async fn predict_inner(
    st: &Arc<Shared>,
    metrics: &Metrics,
    headers: &HeaderMap,
    query: Option<&str>,
    body: Body,
    started: Instant,
) -> Result<Response, ApiError> {
    // Admission first: the body is held in memory from here on.
    let _permit = st
        .admit
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::busy(format!("busy: {} requests in progress, the most this server takes (moge serve --queue)", st.cfg.queue)))?;
    let _in_progress = metrics.in_progress();
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is over this server's limit of {} bytes (moge serve --max-body-mb)", st.cfg.max_body),
        )
    };
    if let Some(n) = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok()) {
        if n > st.cfg.max_body as u64 {
            return Err(too_large());
        }
    }
    let bytes = match tokio::time::timeout(st.cfg.body_timeout, axum::body::to_bytes(body, st.cfg.max_body)).await {
        Err(_) => {
            return Err(ApiError::new(StatusCode::REQUEST_TIMEOUT, format!("the request body did not arrive within {} s", st.cfg.body_timeout.as_secs())))
        }
        Ok(Err(e)) if is_length_limit(&e) => return Err(too_large()),
        Ok(Err(e)) => return Err(ApiError::bad_request(format!("cannot read the request body: {e}"))),
        Ok(Ok(b)) => b,
    };
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let req = request::parse(content_type, query, &bytes, st.cfg.max_tokens)?;
    drop(bytes);
    let req = Arc::new(req);

    // Decode and prepare on a host thread.
    let plan = Plan { infer: req.infer.clone(), fit: req.fit, canvas: st.cfg.canvas, ..Plan::default() };
    let (staged, decode_ms, warning) = {
        let _slot = st.decoders.clone().acquire_owned().await.map_err(|_| ApiError::internal("shutting down"))?;
        let (st2, req2, plan2) = (st.clone(), req.clone(), plan.clone());
        host(move || {
            let t = Instant::now();
            let d = crate::image_io::decode_bytes(&req2.image, &st2.cfg.decode)
                .map_err(|e| ApiError::bad_request(format!("image: {}", crate::console::error_line(&e))))?;
            let decode_ms = ms(t);
            let (w, h) = (d.image.width() as usize, d.image.height() as usize);
            if req2.format == OutputFormat::Json && w * h > JSON_MAX_PIXELS {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("output_format json is for images up to 512x512 pixels; this one is {w}x{h} (use npz, npz_binary or png)"),
                ));
            }
            let staged = stages::prepare(&st2.model, &d.image, &plan2).map_err(|e| ApiError::bad_request(format!("image: {e:#}")))?;
            Ok((staged, decode_ms, d.warning))
        })
        .await?
    };

    // The forward.
    let queued = Instant::now();
    let (tx, rx) = oneshot::channel();
    let at_device = metrics.at_device();
    match st.worker.try_submit(DeviceJob { staged, reply: tx }) {
        Ok(()) => {}
        Err(Refused::Busy(_)) => return Err(ApiError::busy("busy: the device queue is full")),
        Err(Refused::Gone(_)) => return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting down")),
    }
    let (staged, out) = rx.await.map_err(|_| ApiError::internal("the device worker stopped"))?;
    drop(at_device);
    let (raw, device_ms) = out.map_err(|e| ApiError::internal(crate::console::error_line(&e)))?;
    metrics.forward(device_ms / 1e3);
    let queue_ms = (ms(queued) - device_ms).max(0.0);

    // Post-process and encode on a host thread.
    let _slot = st.encoders.clone().acquire_owned().await.map_err(|_| ApiError::internal("shutting down"))?;
    let st2 = st.clone();
    let fit = req.fit.name();
    let response = host(move || {
        let t = Instant::now();
        let pred = stages::finish(&st2.model, &staged, &raw, &plan);
        drop(raw);
        let stats = DepthStats::of(&pred);
        let postprocess_ms = ms(t);
        let mut meta = Meta::new(&pred, &stats, staged.opts.tokens(st2.model.config.num_tokens_range), fit, warning);
        let t = Instant::now();
        let body = response::encode(&pred, &req, &mut meta, st2.cfg.depth_png_scale, st2.cfg.npz_compression)?;
        meta.timing_ms = response::Timing {
            decode: decode_ms,
            prepare: staged.prepare_ms,
            queue: queue_ms,
            device: device_ms,
            postprocess: postprocess_ms,
            encode: ms(t),
            total: ms(started),
        };
        Ok(response::respond(&meta, body))
    })
    .await?;
    Ok(response)
}

/// Runs host work on tokio's blocking pool, a panic in it being this request's 500.
async fn host<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    let joined = tokio::task::spawn_blocking(move || catch(f).unwrap_or_else(|msg| Err(ApiError::internal(format!("internal error: {msg}"))))).await;
    joined.unwrap_or_else(|e| Err(ApiError::internal(format!("internal error: {e}"))))
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if s.to_string().to_lowercase().contains("length limit") {
            return true;
        }
        src = s.source();
    }
    false
}

/// Binds `host:port`, or the next free port above it (up to 100 tries) when it is taken;
/// port 0 takes any free port.
pub async fn bind(host: &str, port: u16) -> anyhow::Result<tokio::net::TcpListener> {
    use anyhow::Context;
    let tries = if port == 0 { 1 } else { 100 };
    let mut last = None;
    for p in (0..tries).filter_map(|i| port.checked_add(i)) {
        match tokio::net::TcpListener::bind((host, p)).await {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e).with_context(|| format!("cannot listen on {host}:{p}")),
        }
    }
    Err(last.map(anyhow::Error::from).unwrap_or_else(|| anyhow::anyhow!("no port")))
        .with_context(|| format!("cannot listen on {host}: ports {port}..{} are all taken", port.saturating_add(tries - 1)))
}

/// Serves on `listener` until Ctrl-C or SIGTERM; then answers `/health` with 503, stops
/// accepting, lets the requests in progress finish, and returns.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<Service>) -> anyhow::Result<()> {
    let sv = state.clone();
    let stop = async move {
        shutdown_signal().await;
        sv.stopping();
    };
    axum::serve(listener, app(state)).with_graceful_shutdown(stop).await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    crate::errln!("moge: stopping: finishing the requests in progress");
}
