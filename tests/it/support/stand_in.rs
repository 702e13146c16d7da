//! A stand-in MoGe-2 server for the client side's tests and benchmarks (`examples/pool_bench.rs`
//! includes this file too, with `mock.rs`): a [`Mock`] that answers `/predict` after a fixed
//! delay with a made-up prediction of the photo's size, so that a test of a pool measures the
//! pool and not the two cores.

use std::collections::HashMap;
use std::io::Cursor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine;
use moge::outputs::npz::{encode, Compression, NormalDtype};
use moge::Prediction;
use serde_json::{json, Value};

use super::mock::Mock;

pub struct StandIn {
    mock: Mock,
    requests: Arc<AtomicUsize>,
}

impl StandIn {
    /// On a free port, answering each prediction `delay` after its request arrived.
    pub fn start(delay: Duration) -> StandIn {
        Self::start_on("127.0.0.1:0".parse().unwrap(), delay).unwrap()
    }

    /// On `addr` (a server that comes back where it was).
    pub fn start_on(addr: SocketAddr, delay: Duration) -> std::io::Result<StandIn> {
        let requests = Arc::new(AtomicUsize::new(0));
        let mock = Mock::start_on(addr, app(delay, requests.clone()))?;
        Ok(StandIn { mock, requests })
    }

    pub fn url(&self) -> String {
        self.mock.url()
    }

    /// Predictions asked of it so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn app(delay: Duration, requests: Arc<AtomicUsize>) -> Router {
    let cache: Arc<Mutex<HashMap<(usize, usize), Bytes>>> = Arc::default();
    Router::new()
        .route("/health", get(|| async { axum::Json(json!({"status": "ok"})) }))
        .route(
            "/info",
            get(|| async {
                axum::Json(json!({"server": "stand-in", "model": "stand-in", "device": "stand-in", "output_formats": ["npz_binary"],
                                  "npz_normal_dtypes": ["float32", "float16"], "has_normal": true, "weights_sha256": "0".repeat(64)}))
            }),
        )
        .route(
            "/predict",
            post(move |body: Bytes| {
                let (requests, cache) = (requests.clone(), cache.clone());
                async move {
                    requests.fetch_add(1, Ordering::SeqCst);
                    let started = std::time::Instant::now();
                    let answer = tokio::task::spawn_blocking(move || answer(&body, &cache)).await.unwrap();
                    tokio::time::sleep(delay.saturating_sub(started.elapsed())).await;
                    answer
                }
            }),
        )
}

/// The npz of a made-up prediction of the photo's size, and its metadata.
fn answer(body: &[u8], cache: &Mutex<HashMap<(usize, usize), Bytes>>) -> Response {
    let Some((w, h)) = photo_size(body) else {
        return (axum::http::StatusCode::BAD_REQUEST, axum::Json(json!({"error": "image: cannot read its size"}))).into_response();
    };
    let npz = cache.lock().unwrap().entry((w, h)).or_insert_with(|| npz_of(&made_up(w, h))).clone();
    let meta = json!({"width": w, "height": h, "timing_ms": {"device": 1.0, "total": 1.0}});
    ([("content-type", "application/x-npz".to_owned()), ("x-moge-meta", meta.to_string())], npz).into_response()
}

fn photo_size(body: &[u8]) -> Option<(usize, usize)> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(v.get("image")?.as_str()?).ok()?;
    let (w, h) = image::ImageReader::new(Cursor::new(bytes)).with_guessed_format().ok()?.into_dimensions().ok()?;
    Some((w as usize, h as usize))
}

/// A slanted plane in front of a camera of 60° horizontal field of view.
fn made_up(width: usize, height: usize) -> Prediction {
    let n = width * height;
    let (mut points, mut depth) = (Vec::with_capacity(3 * n), Vec::with_capacity(n));
    let fx = 0.5 / (30f32.to_radians().tan());
    let fy = fx * width as f32 / height as f32;
    for i in 0..n {
        let (u, v) = (((i % width) as f32 + 0.5) / width as f32, ((i / width) as f32 + 0.5) / height as f32);
        let z = 2.0 + v;
        depth.push(z);
        points.extend([(u - 0.5) / fx * z, (v - 0.5) / fy * z, z]);
    }
    let normal = [0.0, -std::f32::consts::FRAC_1_SQRT_2, -std::f32::consts::FRAC_1_SQRT_2].repeat(n);
    Prediction {
        width,
        height,
        points,
        depth,
        normal: Some(normal),
        normal_png: None,
        mask: vec![true; n],
        intrinsics: [[fx, 0.0, 0.5], [0.0, fy, 0.5], [0.0, 0.0, 1.0]],
        metric_scale: 1.0,
        focal: 2.0 * fx * height as f32 / (width as f32).hypot(height as f32),
        shift: 0.0,
        per_step: Vec::new(),
        grid: (1, 1),
    }
}

fn npz_of(p: &Prediction) -> Bytes {
    encode(Cursor::new(Vec::new()), p, Compression::None, NormalDtype::Float32).unwrap().into_inner().into()
}
