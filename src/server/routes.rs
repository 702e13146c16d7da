//! The HTTP API's routes and their handlers.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::error::ApiError;
use super::metrics::{Held, Metrics};
use super::response::{Meta, JSON_MAX_PIXELS};
use super::service::{DeviceJob, Phase, Service, Shared};
use super::{metrics, page, request, response};
use crate::outputs::json::DepthStats;
use crate::pipeline::guard::catch;
use crate::pipeline::plan::{self, ms, Plan};
use crate::pipeline::worker::Refused;
use crate::protocol::OutputFormat;

/// The routes, on `state` (tests drive this without a socket).
pub fn app(state: Arc<Service>) -> Router {
    Router::new()
        .route("/", get(page::index))
        .route("/page/{name}", get(page::asset))
        .route("/predict", post(predict))
        .route("/predict_panorama", post(predict_panorama))
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
        "depth_png_scale": st.cfg.depth_png_scale,
    }))
    .into_response()
}

async fn models(State(sv): State<Arc<Service>>) -> Response {
    let id = sv.loaded.get().map(|st| st.cfg.model_id.as_str()).unwrap_or("loading");
    axum::Json(json!({ "object": "list", "data": [{ "id": id, "object": "model", "owned_by": "moge" }] })).into_response()
}

async fn predict(State(sv): State<Arc<Service>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Response {
    let started = Instant::now();
    counted(&sv, started, |st| predict_inner(st, &sv.metrics, &headers, query.as_deref(), body, started)).await
}

/// A prediction's answer on the loaded model (or why there is none), counted in the metrics.
async fn counted<'a, F>(sv: &'a Service, started: Instant, inner: impl FnOnce(&'a Arc<Shared>) -> F) -> Response
where
    F: std::future::Future<Output = Result<Response, ApiError>> + 'a,
{
    let answer = match sv.serving() {
        Ok(st) => inner(st).await,
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
    let (_permit, _in_progress, req) = admit_and_read(st, metrics, headers, query, body).await?;
    let req = Arc::new(req);

    // Decode and prepare on a host thread.
    let plan = Plan { infer: req.infer.clone(), fit: req.fit, canvas: st.cfg.canvas, ..Plan::default() };
    let (placed, decode_ms, warning) = {
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
            let placed = plan::prepare(&st2.model, &d.image, &plan2).map_err(|e| ApiError::bad_request(format!("image: {e:#}")))?;
            Ok((placed, decode_ms, d.warning))
        })
        .await?
    };

    // The forward.
    let queued = Instant::now();
    let (placed, raw, device_ms) = forward(st, metrics, placed).await?;
    let queue_ms = (ms(queued) - device_ms).max(0.0);

    // Post-process and encode on a host thread.
    let _slot = st.encoders.clone().acquire_owned().await.map_err(|_| ApiError::internal("shutting down"))?;
    let st2 = st.clone();
    let fit = req.fit.name();
    let response = host(move || {
        let t = Instant::now();
        let pred = plan::finish(&st2.model, &placed, &raw, &plan);
        drop(raw);
        let stats = DepthStats::of(&pred);
        let postprocess_ms = ms(t);
        let mut meta = Meta::new(&pred, &stats, placed.opts.tokens(st2.model.config.num_tokens_range), fit, warning);
        let t = Instant::now();
        let body = response::encode(&pred, &req, &mut meta, st2.cfg.depth_png_scale, st2.cfg.npz_compression)?;
        meta.timing_ms = response::Timing {
            decode: decode_ms,
            prepare: placed.prepare_ms,
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

async fn predict_panorama(State(sv): State<Arc<Service>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Response {
    let started = Instant::now();
    counted(&sv, started, |st| panorama_inner(st, &sv.metrics, &headers, query.as_deref(), body, started)).await
}

/// `POST /predict_panorama`: an equirectangular photo, as `moge panorama` makes it (views of
/// upstream's 512 pixels), answered with the panorama's npz file itself (`moge panorama`'s
/// layout) and its figures in the `x-moge-meta` header. Takes `/predict`'s request forms and
/// its `num_tokens`, `resolution_level` and `apply_mask`; `fov_x` and a fit do not apply.
async fn panorama_inner(
    st: &Arc<Shared>,
    metrics: &Metrics,
    headers: &HeaderMap,
    query: Option<&str>,
    body: Body,
    started: Instant,
) -> Result<Response, ApiError> {
    use crate::panorama::{cameras, split};
    let (_permit, _in_progress, req) = admit_and_read(st, metrics, headers, query, body).await?;
    if req.infer.fov_x.is_some() || req.fit != crate::fit::FitMode::Exact {
        return Err(ApiError::bad_request("a panorama's views have their own field of view (90°) and size: no fov_x, no fit"));
    }
    if !matches!(req.format, OutputFormat::Npz | OutputFormat::NpzBinary) {
        return Err(ApiError::bad_request("a panorama is answered as its npz file (output_format npz or npz_binary)"));
    }
    let apply_mask = req.infer.apply_mask;
    let plan = Plan { infer: crate::infer::InferOptions { fov_x: Some(cameras::VIEW_FOV_DEGREES), apply_mask: false, ..req.infer.clone() }, ..Plan::default() };
    let (st2, image) = (st.clone(), req.image);
    let (photo, views) = host(move || {
        let d =
            crate::image_io::decode_bytes(&image, &st2.cfg.decode).map_err(|e| ApiError::bad_request(format!("image: {}", crate::console::error_line(&e))))?;
        crate::panorama::check_size(d.image.width(), d.image.height()).map_err(|e| ApiError::bad_request(format!("image: {e}")))?;
        let views = split::split(&d.image, &cameras::views(), crate::panorama::VIEW_SIZE);
        Ok((d.image, views))
    })
    .await?;
    // The views one after another on the device worker, each waiting its turn in its queue.
    let mut preds = Vec::with_capacity(views.len());
    let mut device_ms = 0.0;
    for view in views {
        let (st2, plan2) = (st.clone(), plan.clone());
        let placed = host(move || plan::prepare(&st2.model, &view, &plan2).map_err(|e| ApiError::bad_request(format!("image: {e:#}")))).await?;
        let (placed, raw, ms_) = forward(st, metrics, placed).await?;
        device_ms += ms_;
        let (st2, plan2) = (st.clone(), plan.clone());
        preds.push(host(move || Ok(plan::finish(&st2.model, &placed, &raw, &plan2))).await?);
    }
    let compression = st.cfg.npz_compression;
    let (w, h) = (photo.width() as usize, photo.height() as usize);
    host(move || {
        let pano = crate::panorama::from_views(&preds, w, h, apply_mask).map_err(|e| ApiError::internal(format!("{e:#}")))?;
        let body = crate::outputs::panorama::encode_npz(std::io::Cursor::new(Vec::new()), &pano, compression)
            .map_err(|e| ApiError::internal(format!("cannot encode the outputs: {e:#}")))?
            .into_inner();
        let p = &pano.prediction;
        let meta = json!({
            "width": p.width, "height": p.height, "projection": "equirectangular", "metric_scale": p.metric_scale,
            "view_metric_scale": pano.view_metric_scales, "lsmr_iterations": pano.iterations,
            "timing_ms": { "device": device_ms, "merge": pano.merge_ms, "total": ms(started) },
        });
        let mut r = (StatusCode::OK, body).into_response();
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-npz"));
        if let Ok(v) = HeaderValue::from_str(&response::ascii_json(&meta.to_string())) {
            r.headers_mut().insert("x-moge-meta", v);
        }
        Ok(r)
    })
    .await
}

/// One forward on the device worker, in its queue: the staged photo back, the network's
/// output and the device's milliseconds (counted in the metrics).
async fn forward(st: &Arc<Shared>, metrics: &Metrics, placed: plan::Placed) -> Result<(plan::Placed, crate::model::RawOutput, f64), ApiError> {
    let (tx, rx) = oneshot::channel();
    let at_device = metrics.at_device();
    match st.worker.try_submit(DeviceJob { placed, reply: tx }) {
        Ok(()) => {}
        Err(Refused::Busy(_)) => return Err(ApiError::busy("busy: the device queue is full")),
        Err(Refused::Gone(_)) => return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting down")),
    }
    let (placed, out) = rx.await.map_err(|_| ApiError::internal("the device worker stopped"))?;
    drop(at_device);
    let (raw, device_ms) = out.map_err(|e| ApiError::internal(crate::console::error_line(&e)))?;
    metrics.forward(device_ms / 1e3);
    Ok((placed, raw, device_ms))
}

/// Admission, then the body read within its limits, parsed and checked against the model: how
/// both predictions start.
async fn admit_and_read<'m>(
    st: &Arc<Shared>,
    metrics: &'m Metrics,
    headers: &HeaderMap,
    query: Option<&str>,
    body: Body,
) -> Result<(OwnedSemaphorePermit, Held<'m>, request::Request), ApiError> {
    // Admission first: the body is held in memory from here on.
    let permit = st
        .admit
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::busy(format!("busy: {} requests in progress, the most this server takes (moge serve --queue)", st.cfg.queue)))?;
    let in_progress = metrics.in_progress();
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
    if req.infer.refine_steps.is_some_and(|n| n > 0) && !st.model.has_refiner() {
        return Err(ApiError::bad_request("refine_steps: this server runs a MoGe-2 model, which has no refiner (refine_steps needs MoGe-3)"));
    }
    Ok((permit, in_progress, req))
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
