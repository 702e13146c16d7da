//! `moge::remote`: the npz read back (from this crate's encoder and from numpy), and the HTTP
//! client against mock servers on 127.0.0.1 (axum, one runtime per server, stopped at the end
//! of each test): answer formats, the fallback, retries, errors, timeouts, a server that is
//! not there or goes away.

use std::io::{Cursor, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use moge::outputs::npz::{encode, Compression, NormalDtype};
use moge::protocol::{FitMode as Fit, PredictOptions as Request};
use moge::remote::{image_for_server, read_prediction, Client, ClientOptions, RemoteError};
use moge::Prediction;
use serde_json::{json, Value};

use crate::support::mock::Mock;
use crate::support::paths::fixtures;
use crate::support::png::chunk;

// ---------------------------------------------------------------------------------------------
// Predictions

/// A prediction whose every field differs per pixel, with invalid pixels (inf depth and
/// points, zero normal) and intrinsics of a known focal.
fn synthetic(height: usize, width: usize, with_normal: bool) -> Prediction {
    let n = height * width;
    let mut points = Vec::with_capacity(3 * n);
    let mut depth = Vec::with_capacity(n);
    let mut normal = Vec::with_capacity(3 * n);
    let mut mask = Vec::with_capacity(n);
    for i in 0..n {
        let (y, x) = ((i / width) as f32, (i % width) as f32);
        let valid = i % 7 != 3;
        let z = 0.5 + 0.0137 * x + 0.291 * y + (i as f32).sin() * 0.01;
        if valid {
            depth.push(z);
            points.extend([(x - 3.3) * z * 0.11, (y - 2.7) * z * 0.13, z]);
            let (a, b) = (0.3 * (x * 0.7).sin(), 0.2 * (y * 1.3).cos());
            let l = (a * a + b * b + 1.0).sqrt();
            normal.extend([a / l, b / l, -1.0 / l]);
        } else {
            depth.push(f32::INFINITY);
            points.extend([f32::INFINITY; 3]);
            normal.extend([0.0; 3]);
        }
        mask.push(valid);
    }
    let focal = 1.37f32;
    let aspect = width as f64 / height as f64;
    let diag = (1.0 + aspect * aspect).sqrt();
    let (fx, fy) = (focal / 2.0 * diag as f32 / aspect as f32, focal / 2.0 * diag as f32);
    Prediction {
        width,
        height,
        points,
        depth,
        normal: with_normal.then_some(normal),
        normal_png: None,
        mask,
        intrinsics: [[fx, 0.0, 0.5], [0.0, fy, 0.5], [0.0, 0.0, 1.0]],
        metric_scale: 3.75,
        focal,
        shift: 0.25,
        per_step: Vec::new(),
        grid: (4, 6),
    }
}

fn npz_of(p: &Prediction, compression: Compression, dtype: NormalDtype) -> Vec<u8> {
    encode(Cursor::new(Vec::new()), p, compression, dtype).unwrap().into_inner()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Everything the npz holds equal (bit for bit), normals within `normal_tol`.
fn assert_same(got: &Prediction, want: &Prediction, normal_tol: f32) {
    assert_eq!((got.height, got.width), (want.height, want.width));
    assert_eq!(bits(&got.points), bits(&want.points), "points");
    assert_eq!(bits(&got.depth), bits(&want.depth), "depth");
    assert_eq!(got.mask, want.mask, "mask");
    assert_eq!(got.intrinsics, want.intrinsics, "intrinsics");
    assert_eq!(got.metric_scale.to_bits(), want.metric_scale.to_bits(), "metric_scale");
    match (&got.normal, &want.normal) {
        (None, None) => {}
        (Some(g), Some(w)) => {
            assert_eq!(g.len(), w.len());
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                assert!((a - b).abs() <= normal_tol, "normal[{i}]: {a} vs {b}");
            }
        }
        (g, w) => panic!("normal present: got {}, want {}", g.is_some(), w.is_some()),
    }
}

#[test]
fn npz_read_back_equals_what_was_encoded() {
    for with_normal in [true, false] {
        let p = synthetic(6, 9, with_normal);
        for compression in [Compression::None, Compression::Fast] {
            for dtype in [NormalDtype::Float32, NormalDtype::Float16] {
                let got = read_prediction(&npz_of(&p, compression, dtype)).unwrap();
                // float16 has 11 significant bits: 2^-11 relative on values up to 1.
                let tol = if dtype == NormalDtype::Float16 { 1.0 / 2048.0 } else { 0.0 };
                assert_same(&got, &p, tol);
                assert!(got.depth.iter().filter(|d| d.is_infinite()).count() > 0);
                // Not in the npz: the focal follows from the intrinsics, the rest is "unknown".
                assert!((got.focal - p.focal).abs() < 1e-6, "focal {} vs {}", got.focal, p.focal);
                assert_eq!((got.shift, got.grid), (0.0, (0, 0)));
                if dtype == NormalDtype::Float16 && with_normal {
                    let n = got.normal.as_ref().unwrap();
                    assert!(n.iter().zip(p.normal.as_ref().unwrap()).any(|(a, b)| a != b), "f16 read as if exact");
                }
            }
        }
    }
}

#[test]
fn npz_as_numpy_writes_it() {
    // tests/make_remote_npz.py: np.savez_compressed, bool mask, float16 normal, float64
    // intrinsics and metric_scale; pixel (1, 2) invalid.
    let bytes = std::fs::read(fixtures().join("remote/numpy_prediction.npz")).unwrap();
    let p = read_prediction(&bytes).unwrap();
    assert_eq!((p.height, p.width), (4, 5));
    assert_eq!(p.metric_scale, 2.5);
    assert_eq!(p.intrinsics, [[0.8, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]]);
    let normal = p.normal.as_ref().expect("normal");
    for y in 0..4 {
        for x in 0..5 {
            let i = y * 5 + x;
            let (xf, yf) = (x as f32, y as f32);
            if (y, x) == (1, 2) {
                assert!(!p.mask[i] && p.depth[i] == f32::INFINITY && p.points[3 * i..3 * i + 3] == [f32::INFINITY; 3]);
                assert_eq!(normal[3 * i..3 * i + 3], [0.0; 3]);
                continue;
            }
            let d = 1.0 + 0.25 * xf + 0.5 * yf;
            assert!(p.mask[i]);
            assert_eq!(p.depth[i], d);
            assert_eq!(p.points[3 * i..3 * i + 3], [(xf - 2.0) * 0.125 * d, (yf - 1.5) * 0.125 * d, d]);
            let v = [xf / 8.0 - 0.25, yf / 8.0 - 0.25, -1.0];
            let l = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
            for c in 0..3 {
                assert!((normal[3 * i + c] - v[c] / l).abs() < 1e-3, "normal ({y}, {x}, {c})");
            }
        }
    }
}

/// An npz of the given (name, .npy bytes) entries.
fn zip_of(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (name, data) in entries {
        zip.start_file(format!("{name}.npy"), zip::write::SimpleFileOptions::default()).unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn npy<T: ndarray_npy::WritableElement, D: ndarray::Dimension>(a: ndarray::Array<T, D>) -> Vec<u8> {
    use ndarray_npy::WriteNpyExt;
    let mut out = Vec::new();
    a.write_npy(&mut out).unwrap();
    out
}

/// The entries of a whole 2x3 prediction, to spoil one at a time.
fn entries() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("points", npy(ndarray::Array3::<f32>::zeros((2, 3, 3)))),
        ("depth", npy(ndarray::Array2::<f32>::ones((2, 3)))),
        ("mask", npy(ndarray::Array2::<u8>::ones((2, 3)))),
        ("intrinsics", npy(ndarray::Array2::<f32>::eye(3))),
        ("metric_scale", npy(ndarray::arr0(1f32))),
    ]
}

#[test]
fn npz_errors_name_the_array_and_the_reason() {
    let err = |entries: Vec<(&str, Vec<u8>)>| format!("{:#}", read_prediction(&zip_of(&entries)).unwrap_err());
    assert!(read_prediction(&zip_of(&entries())).is_ok());
    let without = |name: &str| entries().into_iter().filter(|(n, _)| *n != name).collect::<Vec<_>>();
    let replaced = |name: &str, data: Vec<u8>| entries().into_iter().map(|(n, d)| if n == name { (n, data.clone()) } else { (n, d) }).collect::<Vec<_>>();

    for name in ["points", "depth", "mask", "intrinsics", "metric_scale"] {
        let e = err(without(name));
        assert!(e.contains(&format!("no `{name}` array")), "{e}");
    }
    let e = err(replaced("points", npy(ndarray::Array3::<f32>::zeros((2, 3, 4)))));
    assert!(e.contains("points.npy has shape [2, 3, 4], expected [2, 3, 3]"), "{e}");
    let e = err(replaced("depth", npy(ndarray::Array3::<f32>::zeros((2, 3, 1)))));
    assert!(e.contains("depth.npy has shape"), "{e}");
    let e = err(replaced("mask", npy(ndarray::Array2::<f32>::ones((2, 3)))));
    assert!(e.contains("mask.npy has element type <f4"), "{e}");
    let e = err(replaced("depth", npy(ndarray::Array2::<i32>::ones((2, 3)))));
    assert!(e.contains("depth.npy has element type <i4"), "{e}");
    let e = err(replaced("metric_scale", npy(ndarray::arr1(&[1f32, 2.0]))));
    assert!(e.contains("metric_scale.npy has shape [2], expected a scalar"), "{e}");
    // A header that claims more data than the entry holds: refused before allocating.
    let mut lying = npy(ndarray::Array2::<f32>::ones((2, 3)));
    let at = lying.windows(6).position(|w| w == b"(2, 3)").unwrap();
    lying[at..at + 6].copy_from_slice(b"(2,99)");
    let e = err(replaced("depth", lying));
    assert!(e.contains("depth.npy is damaged"), "{e}");
    // The data cut short.
    let mut short = npy(ndarray::Array2::<f32>::ones((2, 3)));
    short.truncate(short.len() - 4);
    let e = err(replaced("depth", short));
    assert!(e.contains("cannot read depth.npy: reached EOF"), "{e}");
    // Not a zip, a zip cut short, an entry that is not .npy.
    for (bytes, want) in [
        (b"not a zip file at all".to_vec(), "not a valid npz"),
        (zip_of(&entries())[..200].to_vec(), "not a valid npz"),
        (zip_of(&replaced("depth", b"garbage".to_vec())), "depth.npy is not a valid .npy"),
    ] {
        let e = format!("{:#}", read_prediction(&bytes).unwrap_err());
        assert!(e.contains(want), "{e}");
    }
    // A deflated entry whose data was damaged: the checksum catches it.
    let mut bytes = npz_of(&synthetic(6, 9, true), Compression::Fast, NormalDtype::Float32);
    let mid = bytes.len() / 3;
    for b in &mut bytes[mid..mid + 16] {
        *b ^= 0x5a;
    }
    assert!(read_prediction(&bytes).is_err());
}

// ---------------------------------------------------------------------------------------------
// Mock servers

/// `/health`, `/info` (as given) and `/predict`.
fn app(info: Value, predict: MethodRouter) -> Router {
    Router::new()
        .route("/health", get(|| async { axum::Json(json!({"status": "ok"})) }))
        .route("/info", get(move || async move { axum::Json(info) }))
        .route("/predict", predict)
}

fn moge_info() -> Value {
    json!({"model": "MoGe-2 ViT-S (normal)", "variant": "vits-normal", "precision": "f32", "device": "cpu",
           "version": "0.1.0", "output_formats": ["npz_binary", "npz", "png", "json"]})
}

/// The metadata a server sends beside the npz.
fn meta_of(p: &Prediction) -> Value {
    json!({"height": p.height, "width": p.width, "metric_scale": p.metric_scale, "fov_x_deg": 60.0,
           "mask_coverage": p.valid_fraction(), "timing_ms": {"device": 12.5, "total": 20.25}})
}

fn npz_reply(p: &Prediction) -> Response {
    let npz = npz_of(p, Compression::None, NormalDtype::Float16);
    ([("content-type", "application/x-npz".to_owned()), ("x-moge-meta", meta_of(p).to_string())], npz).into_response()
}

fn json_reply(p: &Prediction) -> Response {
    let mut meta = meta_of(p);
    meta["outputs"] = json!({"npz": BASE64.encode(npz_of(p, Compression::Fast, NormalDtype::Float16))});
    axum::Json(meta).into_response()
}

fn error_reply(status: u16, body: Value) -> Response {
    (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response()
}

fn fast(retries: u32) -> ClientOptions {
    ClientOptions { timeout: Duration::from_secs(5), retries, in_flight: 2, backoff: Duration::from_millis(1), ..Default::default() }
}

/// Request bodies as received, and how many.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Value>>>);

impl Log {
    fn push(&self, body: &Bytes) -> usize {
        let mut log = self.0.lock().unwrap();
        log.push(serde_json::from_slice(body).unwrap_or(Value::Null));
        log.len()
    }
    fn all(&self) -> Vec<Value> {
        self.0.lock().unwrap().clone()
    }
}

// ---------------------------------------------------------------------------------------------
// The client

#[test]
fn predict_npz_binary() {
    let p = synthetic(5, 8, true);
    let log = Log::default();
    let (answer, headers_seen) = (p.clone(), Arc::new(Mutex::new(None)));
    let seen = headers_seen.clone();
    let l = log.clone();
    let mock = Mock::start(app(
        moge_info(),
        post(move |headers: HeaderMap, body: Bytes| async move {
            l.push(&body);
            *seen.lock().unwrap() = headers.get("content-type").map(|v| v.to_str().unwrap().to_owned());
            npz_reply(&answer)
        }),
    ));
    // host:port with a trailing slash, as a person types it.
    let client = Client::connect(&format!("{}/", mock.addr), fast(1)).unwrap();
    assert_eq!(client.url(), mock.url());
    assert_eq!(client.model(), Some("MoGe-2 ViT-S (normal)"));
    assert_eq!(client.device(), Some("cpu"));
    assert_eq!(client.info()["precision"], "f32");

    let image = b"\x89PNG\r\n\x1a\n pretend image bytes \x00\xff".to_vec();
    let req = Request { fov_x: Some(60.0), num_tokens: Some(1200), fit: Some(Fit::Pad), ..Default::default() };
    let r = client.predict(&image, &req).unwrap();
    assert_same(&r.pred, &p, 1.0 / 2048.0);
    assert_eq!(r.attempts, 1);
    assert_eq!((r.device_ms, r.total_ms), (Some(12.5), Some(20.25)));
    assert_eq!(r.meta["width"], 8);

    let sent = log.all();
    assert_eq!(sent.len(), 1);
    let body = sent[0].as_object().unwrap();
    assert_eq!(BASE64.decode(body["image"].as_str().unwrap()).unwrap(), image);
    assert_eq!(body["output_format"], "npz_binary");
    assert_eq!(body["fov_x"], 60.0);
    assert_eq!(body["num_tokens"], 1200);
    assert_eq!(body["fit"], "pad");
    let mut keys: Vec<&str> = body.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["fit", "fov_x", "image", "num_tokens", "output_format"], "unset options are not sent");
    assert_eq!(headers_seen.lock().unwrap().as_deref(), Some("application/json"));
}

#[test]
fn request_from_options_sends_what_differs_from_the_defaults() {
    let d = moge::InferOptions::default();
    assert_eq!(Request::from_options(&d), Request::default());
    let o = moge::InferOptions { resolution_level: 3, apply_mask: false, fov_x: Some(50.0), ..d.clone() };
    let want = Request { resolution_level: Some(3), apply_mask: Some(false), fov_x: Some(50.0), ..Default::default() };
    assert_eq!(Request::from_options(&o), want);
    // num_tokens decides over resolution_level, as in infer().
    let o = moge::InferOptions { num_tokens: Some(900), resolution_level: 3, force_projection: false, ..d };
    let want = Request { num_tokens: Some(900), force_projection: Some(false), ..Default::default() };
    assert_eq!(Request::from_options(&o), want);
}

#[test]
fn falls_back_to_json_once_and_keeps_to_it() {
    let p = synthetic(4, 6, true);
    let (binary, json_asks) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (b, j, answer) = (binary.clone(), json_asks.clone(), p.clone());
    // As FastAPI refuses a value outside a Literal: 422 with a list of validation errors.
    let mock = Mock::start(app(
        json!({"model_name": "moge-2-vitl-normal", "device_type": "n300"}),
        post(move |body: Bytes| async move {
            let body: Value = serde_json::from_slice(&body).unwrap();
            match body["output_format"].as_str() {
                Some("npz") => {
                    j.fetch_add(1, Ordering::SeqCst);
                    json_reply(&answer)
                }
                _ => {
                    b.fetch_add(1, Ordering::SeqCst);
                    error_reply(
                        422,
                        json!({"detail": [{"loc": ["body", "output_format"], "msg": "Input should be 'npz', 'png' or 'json'", "type": "literal_error"}]}),
                    )
                }
            }
        }),
    ));
    let client = Client::connect(&mock.url(), fast(0)).unwrap();
    assert_eq!((client.model(), client.device()), (Some("moge-2-vitl-normal"), Some("n300")));
    let first = client.predict(b"img", &Request::default()).unwrap();
    assert_eq!(first.attempts, 2);
    assert_same(&first.pred, &p, 1.0 / 2048.0);
    assert!(first.meta.get("outputs").is_none(), "the npz is not kept in the metadata");
    assert_eq!(first.meta["height"], 4);
    assert_eq!(first.device_ms, Some(12.5));
    let second = client.predict(b"img", &Request::default()).unwrap();
    assert_eq!(second.attempts, 1);
    assert_eq!((binary.load(Ordering::SeqCst), json_asks.load(Ordering::SeqCst)), (1, 2));
}

#[test]
fn a_refused_image_does_not_switch_the_format() {
    // No `output_formats` in /info, and the first image is refused in both formats: the next
    // one is asked for npz_binary again.
    let p = synthetic(3, 4, false);
    let log = Log::default();
    let (l, answer) = (log.clone(), p.clone());
    let mock = Mock::start(app(
        json!({}),
        post(move |body: Bytes| async move {
            let n = l.push(&body);
            if n <= 2 {
                error_reply(400, json!({"detail": "cannot decode the image"}))
            } else {
                npz_reply(&answer)
            }
        }),
    ));
    let client = Client::connect(&mock.url(), fast(0)).unwrap();
    let e = client.predict(b"bad", &Request::default()).unwrap_err();
    assert!(matches!(e, RemoteError::Rejected { status: 400, .. }), "{e}");
    assert!(e.to_string().contains("cannot decode the image"), "{e}");
    let r = client.predict(b"good", &Request::default()).unwrap();
    assert!(r.pred.normal.is_none());
    let formats: Vec<Value> = log.all().iter().map(|b| b["output_format"].clone()).collect();
    assert_eq!(formats, [json!("npz_binary"), json!("npz"), json!("npz_binary")]);
}

#[test]
fn retries_503_as_retry_after_says() {
    let p = synthetic(3, 5, true);
    let asks = Arc::new(AtomicUsize::new(0));
    let (a, answer) = (asks.clone(), p.clone());
    let mock = Mock::start(app(
        moge_info(),
        post(move || async move {
            if a.fetch_add(1, Ordering::SeqCst) < 2 {
                (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "0")], axum::Json(json!({"error": "queue full"}))).into_response()
            } else {
                npz_reply(&answer)
            }
        }),
    ));
    // A backoff of 10 s: only Retry-After makes this fast.
    let opts = ClientOptions { backoff: Duration::from_secs(10), ..fast(3) };
    let client = Client::connect(&mock.url(), opts).unwrap();
    let t = Instant::now();
    let r = client.predict(b"img", &Request::default()).unwrap();
    assert!(t.elapsed() < Duration::from_secs(3), "Retry-After: 0 ignored ({:?})", t.elapsed());
    assert_eq!(r.attempts, 3);
    assert_eq!(asks.load(Ordering::SeqCst), 3);
    assert_same(&r.pred, &p, 1.0 / 2048.0);
}

#[test]
fn a_500_is_retried_then_reported_with_the_servers_words() {
    let asks = Arc::new(AtomicUsize::new(0));
    let a = asks.clone();
    let mock = Mock::start(app(
        moge_info(),
        post(move || async move {
            a.fetch_add(1, Ordering::SeqCst);
            error_reply(500, json!({"error": "forward failed: out of device memory"}))
        }),
    ));
    let client = Client::connect(&mock.url(), fast(2)).unwrap();
    let e = client.predict(b"img", &Request::default()).unwrap_err();
    assert!(matches!(e, RemoteError::Server { status: 500, attempts: 3, .. }), "{e:?}");
    assert_eq!(asks.load(Ordering::SeqCst), 3);
    let text = e.to_string();
    assert!(text.contains("forward failed: out of device memory"), "{text}");
    assert!(text.contains(&format!("{}/predict", mock.url())), "{text}");
    assert!(text.contains("500 Internal Server Error") && text.contains("after 3 attempts"), "{text}");
    assert!(!e.is_unreachable());
}

#[test]
fn a_4xx_is_rejected_at_once() {
    for (body, want) in [
        (json!({"error": "not an image (unrecognised format)"}), "not an image (unrecognised format)"),
        (json!({"detail": "Image too large: 20000x20000"}), "Image too large: 20000x20000"),
    ] {
        let asks = Arc::new(AtomicUsize::new(0));
        let a = asks.clone();
        let mock = Mock::start(app(
            moge_info(),
            post(move || {
                let body = body.clone();
                async move {
                    a.fetch_add(1, Ordering::SeqCst);
                    error_reply(400, body)
                }
            }),
        ));
        let client = Client::connect(&mock.url(), fast(3)).unwrap();
        let e = client.predict(b"img", &Request::default()).unwrap_err();
        assert!(matches!(&e, RemoteError::Rejected { status: 400, message, .. } if message == want), "{e:?}");
        assert!(e.to_string().contains("400 Bad Request") && e.to_string().contains(want), "{e}");
        assert_eq!(asks.load(Ordering::SeqCst), 1, "a 4xx is not retried");
    }
}

#[test]
fn plain_text_and_empty_errors() {
    let asks = Arc::new(AtomicUsize::new(0));
    let a = asks.clone();
    let mock = Mock::start(app(
        moge_info(),
        post(move || async move {
            match a.fetch_add(1, Ordering::SeqCst) {
                0 => (StatusCode::BAD_GATEWAY, "upstream went away\n").into_response(),
                _ => StatusCode::NOT_IMPLEMENTED.into_response(),
            }
        }),
    ));
    let client = Client::connect(&mock.url(), fast(0)).unwrap();
    let e = client.predict(b"img", &Request::default()).unwrap_err();
    assert!(matches!(&e, RemoteError::Server { status: 502, message, .. } if message == "upstream went away"), "{e:?}");
    let e = client.predict(b"img", &Request::default()).unwrap_err();
    assert!(e.to_string().contains("501 Not Implemented") && e.to_string().contains("(no message)"), "{e}");
}

#[test]
fn a_slow_server_times_out() {
    let asks = Arc::new(AtomicUsize::new(0));
    let a = asks.clone();
    let mock = Mock::start(app(
        moge_info(),
        post(move || async move {
            a.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1500)).await;
            StatusCode::OK.into_response()
        }),
    ));
    let opts = ClientOptions { timeout: Duration::from_millis(200), ..fast(1) };
    let client = Client::connect(&mock.url(), opts).unwrap();
    let t = Instant::now();
    let e = client.predict(b"img", &Request::default()).unwrap_err();
    assert!(t.elapsed() < Duration::from_millis(1400), "waited {:?}", t.elapsed());
    assert!(matches!(e, RemoteError::Timeout { attempts: 2, .. }), "{e:?}");
    assert!(e.to_string().contains("within 0.2 s"), "{e}");
    assert_eq!(asks.load(Ordering::SeqCst), 2);
}

#[test]
fn no_server_is_a_clear_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t = Instant::now();
    let e = Client::connect(&format!("127.0.0.1:{port}"), fast(3)).unwrap_err();
    let text = format!("{e:#}");
    assert_eq!(text, format!("cannot reach the server at http://127.0.0.1:{port}: connection refused (is `moge serve` running?)"));
    assert!(t.elapsed() < Duration::from_secs(1), "no retries on connect: {:?}", t.elapsed());
    // Something else answers there.
    let other = Mock::start(Router::new().route("/", get(|| async { "hello" })));
    let e = format!("{:#}", Client::connect(&other.url(), fast(3)).unwrap_err());
    assert!(e.starts_with(&format!("{} does not answer as a MoGe server: ", other.url())) && e.contains("404 Not Found"), "{e}");
    for (url, want) in [("", "empty"), ("ftp://host:1", "http or https"), ("http://", "not a server URL"), ("http://h:1/?x=1", "query")] {
        let e = format!("{:#}", Client::connect(url, fast(0)).unwrap_err());
        assert!(e.contains(want), "{url}: {e}");
    }
}

#[test]
fn a_server_that_goes_away_is_unreachable() {
    let p = synthetic(3, 3, true);
    let answer = p.clone();
    let mock = Mock::start(app(moge_info(), post(move || async move { npz_reply(&answer) })));
    let url = mock.url();
    let client = Client::connect(&url, fast(2)).unwrap();
    client.predict(b"img", &Request::default()).unwrap();
    drop(mock);
    let e = client.predict(b"img", &Request::default()).unwrap_err();
    assert!(e.is_unreachable(), "{e:?}");
    assert!(matches!(e, RemoteError::Unreachable { attempts: 3, .. }), "{e:?}");
    assert!(e.to_string().starts_with(&format!("cannot reach the server at {url}: ")), "{e}");
}

#[test]
fn bad_answers_are_protocol_errors() {
    let p = synthetic(3, 3, true);
    let asks = Arc::new(AtomicUsize::new(0));
    let (a, answer) = (asks.clone(), p.clone());
    let mock = Mock::start(app(
        moge_info(),
        post(move || async move {
            let meta = [("x-moge-meta", meta_of(&answer).to_string())];
            match a.fetch_add(1, Ordering::SeqCst) {
                0 => (meta, b"PK\x03\x04 this is no npz".to_vec()).into_response(),
                1 => npz_of(&answer, Compression::None, NormalDtype::Float32).into_response(),
                2 => ([("x-moge-meta", "{not json")], npz_of(&answer, Compression::None, NormalDtype::Float32)).into_response(),
                3 => axum::Json(json!({"height": 3, "outputs": {}})).into_response(),
                4 => axum::Json(json!({"outputs": {"npz": "!!!not base64"}})).into_response(),
                _ => (meta, "{\"truncated\": ").into_response(),
            }
        }),
    ));
    let client = Client::connect(&mock.url(), fast(2)).unwrap();
    for want in ["not a valid npz", "no X-MoGe-Meta header", "X-MoGe-Meta header is not JSON", "no outputs.npz", "not base64", "does not parse"] {
        let e = client.predict(b"img", &Request::default()).unwrap_err();
        assert!(matches!(e, RemoteError::Protocol { .. }), "{e:?}");
        assert!(e.to_string().contains(want) && e.to_string().contains("/predict"), "{want}: {e}");
    }
    assert_eq!(asks.load(Ordering::SeqCst), 6, "a bad answer is not retried");
}

#[test]
fn health_503_is_waited_for() {
    let asks = Arc::new(AtomicUsize::new(0));
    let a = asks.clone();
    let app = Router::new().route(
        "/health",
        get(move || async move {
            if a.fetch_add(1, Ordering::SeqCst) == 0 {
                (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "0")], "loading").into_response()
            } else {
                "ok".into_response()
            }
        }),
    );
    // No /info: the client goes on without it.
    let mock = Mock::start(app);
    let client = Client::connect(&mock.url(), fast(2)).unwrap();
    assert_eq!(asks.load(Ordering::SeqCst), 2);
    assert!(client.info().is_null() && client.model().is_none());
}

#[test]
fn many_threads_share_one_client() {
    let p = synthetic(4, 4, true);
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, m, answer) = (now.clone(), most.clone(), p.clone());
    let mock = Mock::start(app(
        moge_info(),
        post(move || async move {
            let k = n.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(k, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            n.fetch_sub(1, Ordering::SeqCst);
            npz_reply(&answer)
        }),
    ));
    let client = Client::connect(&mock.url(), fast(0)).unwrap();
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| assert_same(&client.predict(b"img", &Request::default()).unwrap().pred, &p, 1.0 / 2048.0));
        }
    });
    assert!(most.load(Ordering::SeqCst) <= 2, "in_flight 2, {} at once", most.load(Ordering::SeqCst));
}

#[test]
fn what_is_sent_for_a_photo() {
    use image::{ImageFormat, Rgb, RgbImage};
    use moge::image_io::{decode_bytes_with_source, DecodeOptions};
    let img = RgbImage::from_fn(16, 12, |x, y| Rgb([x as u8 * 9, y as u8 * 13, 200]));
    let encoded = |format: ImageFormat| {
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, format).unwrap();
        out.into_inner()
    };
    let decode_png = |bytes: &[u8]| image::load_from_memory(bytes).unwrap().to_rgb8();
    // JPEG and PNG as they are.
    for format in [ImageFormat::Png, ImageFormat::Jpeg] {
        let bytes = encoded(format);
        let (d, source) = decode_bytes_with_source(&bytes, &DecodeOptions::default()).unwrap();
        assert_eq!(source.format, Some(format));
        assert!(!source.oriented && !source.wide_samples && !source.damaged);
        let sent = image_for_server(&bytes, &source, &d.image).unwrap();
        assert!(matches!(sent, std::borrow::Cow::Borrowed(_)) && *sent == bytes[..]);
    }
    // BMP and 16-bit PNG: the pixels decoded here, as PNG.
    let wide = image::DynamicImage::ImageRgb16(image::ImageBuffer::from_fn(16, 12, |x, _| image::Rgb([x as u16 * 4000, 1234, 65535])));
    let mut wide_png = Cursor::new(Vec::new());
    wide.write_to(&mut wide_png, ImageFormat::Png).unwrap();
    for bytes in [encoded(ImageFormat::Bmp), wide_png.into_inner()] {
        let (d, source) = decode_bytes_with_source(&bytes, &DecodeOptions::default()).unwrap();
        let sent = image_for_server(&bytes, &source, &d.image).unwrap();
        assert!(matches!(sent, std::borrow::Cow::Owned(_)));
        assert_eq!(image::guess_format(&sent).unwrap(), ImageFormat::Png);
        assert_eq!(decode_png(&sent), d.image);
    }
    // An EXIF orientation (6: rotate 90 clockwise) in a PNG: the rotated pixels are sent,
    // and with `--no-exif` the unrotated ones, never the file (the server would rotate it).
    let png = encoded(ImageFormat::Png);
    let oriented = with_exif_orientation(&png, 6);
    for apply_exif in [true, false] {
        let opts = DecodeOptions { apply_exif, ..Default::default() };
        let (d, source) = decode_bytes_with_source(&oriented, &opts).unwrap();
        assert!(source.oriented);
        assert_eq!(d.image.dimensions(), if apply_exif { (12, 16) } else { (16, 12) });
        let sent = image_for_server(&oriented, &source, &d.image).unwrap();
        assert!(matches!(sent, std::borrow::Cow::Owned(_)));
        assert_eq!(decode_png(&sent), d.image);
    }
}

/// `png` with an eXIf chunk holding one Orientation tag, after IHDR (readers look for it
/// before the image data).
fn with_exif_orientation(png: &[u8], orientation: u16) -> Vec<u8> {
    // Little-endian TIFF: header, one IFD of one entry (tag 0x0112, SHORT, count 1), no next.
    let mut exif = b"II*\x00\x08\x00\x00\x00\x01\x00\x12\x01\x03\x00\x01\x00\x00\x00".to_vec();
    exif.extend(orientation.to_le_bytes());
    exif.extend([0, 0, 0, 0, 0, 0]);
    // Signature (8) and IHDR (4 length + 4 type + 13 data + 4 CRC).
    let after_ihdr = 8 + 25;
    [&png[..after_ihdr], &chunk(b"eXIf", &exif)[..], &png[after_ihdr..]].concat()
}
