//! `moge serve`: the model resident behind the HTTP API of the Tenstorrent MoGe-2 server
//! (tt-MoGe): `POST /predict`, `GET /health`, `GET /info`.
//!
//! A request goes through the stages of `moge batch`: decode and prepare on a host thread,
//! the forward on the one device worker ([`crate::pipeline::worker`]), post-process and encode
//! on a host thread, so that with several clients the device never waits for host work.
//! Admission is bounded: past `queue` requests in progress the answer is 503 with
//! `Retry-After`, never more memory.

pub mod request;
pub mod response;

use std::path::PathBuf;
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
use crate::model::{RawOutput, Runner};
use crate::outputs::json::DepthStats;
use crate::outputs::npz::Compression;
use crate::pipeline::guard::catch;
use crate::pipeline::stages::{self, ms, Plan, Staged};
use crate::pipeline::worker::{self, Refused, Worker};
use crate::protocol::OutputFormat;
use crate::Model;
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

/// The routes, on `state` (tests drive this without a socket).
pub fn app(state: Arc<Shared>) -> Router {
    Router::new()
        .route("/predict", post(predict))
        .route("/health", get(health))
        .route("/info", get(info))
        // tt-MoGe's stub, so that tools which probe an OpenAI-style server find something.
        .route("/v1/models", get(models))
        .with_state(state)
}

async fn health() -> Response {
    axum::Json(json!({ "status": "ok" })).into_response()
}

async fn info(State(st): State<Arc<Shared>>) -> Response {
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

async fn models(State(st): State<Arc<Shared>>) -> Response {
    axum::Json(json!({ "object": "list", "data": [{ "id": st.cfg.model_id, "object": "model", "owned_by": "moge" }] })).into_response()
}

async fn predict(State(st): State<Arc<Shared>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Response {
    let started = Instant::now();
    match predict_inner(&st, &headers, query.as_deref(), body, started).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn predict_inner(st: &Arc<Shared>, headers: &HeaderMap, query: Option<&str>, body: Body, started: Instant) -> Result<Response, ApiError> {
    // Admission first: the body is held in memory from here on.
    let _permit = st
        .admit
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::busy(format!("busy: {} requests in progress, the most this server takes (moge serve --queue)", st.cfg.queue)))?;
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
    let plan = Plan { infer: req.infer.clone(), fit: req.fit, canvas: st.cfg.canvas };
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
    match st.worker.try_submit(DeviceJob { staged, reply: tx }) {
        Ok(()) => {}
        Err(Refused::Busy(_)) => return Err(ApiError::busy("busy: the device queue is full")),
        Err(Refused::Gone(_)) => return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting down")),
    }
    let (staged, out) = rx.await.map_err(|_| ApiError::internal("the device worker stopped"))?;
    let (raw, device_ms) = out.map_err(|e| ApiError::internal(crate::console::error_line(&e)))?;
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

/// Serves on `listener` until Ctrl-C or SIGTERM; then stops accepting, lets the requests in
/// progress finish, and returns.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<Shared>) -> anyhow::Result<()> {
    axum::serve(listener, app(state.clone())).with_graceful_shutdown(shutdown_signal()).await?;
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
