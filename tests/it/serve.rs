//! `moge serve` end to end, over loopback only: each test starts its own server on a free port,
//! bounds every wait, and stops the server at the end (Drop kills it if a test fails first).
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::Value;

use crate::support::cli::{moge, run};
use crate::support::npz::Npz;
use crate::support::paths::fixtures;
use crate::support::serve::Server;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(60))).build().into()
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or_else(|| panic!("no error field: {}", String::from_utf8_lossy(&self.body))).to_owned()
    }
}

fn reply(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Reply {
    let mut r = r.unwrap();
    let headers = r.headers().iter().map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_owned())).collect();
    let status = r.status().as_u16();
    let body = r.body_mut().with_config().limit(1 << 30).read_to_vec().unwrap();
    Reply { status, headers, body }
}

fn get(url: &str) -> Reply {
    reply(agent().get(url).call())
}

fn post(url: &str, content_type: &str, body: &[u8]) -> Reply {
    reply(agent().post(url).header("Content-Type", content_type).send(body))
}

fn post_json(s: &Server, v: &Value) -> Reply {
    post(&format!("{}/predict", s.url), "application/json", v.to_string().as_bytes())
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn unb64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap()
}

fn photo_png(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, ((x * 7 + y * 13) % 256) as u8]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn photo_jpeg(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x % 251) as u8, (y % 241) as u8, ((x + y) % 239) as u8]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Jpeg).unwrap();
    out.into_inner()
}

/// What the library computes for the same photo and options.
fn library(bytes: &[u8], opts: &moge::InferOptions) -> moge::Prediction {
    let model = moge::Model::load(&fixtures().join("tiny_normal.pt"), &moge::model::BuildOptions::default()).unwrap();
    let rgb = moge::image_io::decode_bytes(bytes, &Default::default()).unwrap().image;
    model.infer(&rgb, opts).unwrap()
}

/// The npz bytes as a file, through the test's npz reader.
fn npz(bytes: &[u8]) -> (tempfile::TempDir, Npz) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.npz");
    std::fs::write(&path, bytes).unwrap();
    let z = Npz::open(&path);
    (dir, z)
}

/// One `.npy` entry's header and raw data.
fn npy_entry(npz: &[u8], name: &str) -> (String, Vec<u8>) {
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(npz)).unwrap();
    let mut raw = Vec::new();
    zip.by_name(&format!("{name}.npy")).unwrap().read_to_end(&mut raw).unwrap();
    let len = u16::from_le_bytes([raw[8], raw[9]]) as usize;
    (String::from_utf8_lossy(&raw[10..10 + len]).into_owned(), raw[10 + len..].to_vec())
}

fn same_f32(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn answers_with_the_library_numbers_in_every_format() {
    let s = Server::start(&["--jobs", "2", "--queue", "4"]);
    let h = get(&format!("{}/health", s.url));
    assert_eq!((h.status, h.json()["status"].as_str()), (200, Some("ok")));

    // /info names the model and digests the weights (in the background: poll, bounded).
    let want_sha = moge::hub::sha256_file(&fixtures().join("tiny_normal.pt")).unwrap();
    let t = Instant::now();
    let info = loop {
        let i = get(&format!("{}/info", s.url)).json();
        if i["weights_sha256"].is_string() || t.elapsed() > Duration::from_secs(20) {
            break i;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(info["weights_sha256"].as_str(), Some(want_sha.as_str()));
    assert_eq!(info["model"].as_str(), Some("tiny_normal.pt"));
    assert_eq!(info["precision"].as_str(), Some("f32"));
    assert_eq!(info["device"].as_str(), Some("cpu"));
    assert_eq!(info["has_normal"].as_bool(), Some(true));
    assert!(info["variant"].as_str().unwrap().starts_with("dinov2_vit"), "{info}");

    let photo = photo_png(64, 48);
    let opts = moge::InferOptions { num_tokens: Some(300), fov_x: Some(60.0), ..Default::default() };
    let want = library(&photo, &opts);

    // npz (JSON body, base64 out), float32 normals: the library's numbers bit for bit.
    let r = post_json(&s, &serde_json::json!({"image": b64(&photo), "num_tokens": 300, "fov_x": 60, "npz_normal_dtype": "float32"}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!((v["width"].as_u64(), v["height"].as_u64()), (Some(64), Some(48)));
    assert_eq!(v["metric_scale"].as_f64().unwrap() as f32, want.metric_scale);
    assert!((v["fov_x_deg"].as_f64().unwrap() - 60.0).abs() < 1e-3);
    assert_eq!(v["intrinsics"][1][1].as_f64().unwrap() as f32, want.intrinsics[1][1]);
    assert_eq!(v["mask_coverage"].as_f64().unwrap(), want.valid_fraction());
    let stats = moge::outputs::json::DepthStats::of(&want);
    assert_eq!(v["depth_m"]["median"].as_f64().unwrap() as f32, stats.median.unwrap());
    assert_eq!(v["depth_m"]["max"].as_f64().unwrap() as f32, stats.max.unwrap());
    for k in ["decode", "prepare", "device", "postprocess", "encode", "total"] {
        assert!(v["timing_ms"][k].as_f64().unwrap() >= 0.0, "timing_ms.{k}: {v}");
    }
    assert!(v["timing_ms"]["total"].as_f64().unwrap() >= v["timing_ms"]["device"].as_f64().unwrap());
    let bytes = unb64(&v["outputs"]["npz"]);
    let (_d, mut z) = npz(&bytes);
    assert!(same_f32(&z.vec_f32("points"), &want.points));
    assert!(same_f32(&z.vec_f32("depth"), &want.depth));
    assert!(same_f32(&z.vec_f32("normal"), want.normal.as_ref().unwrap()));
    assert_eq!(z.u8("mask").iter().map(|&m| m == 1).collect::<Vec<_>>(), want.mask);
    assert_eq!(z.scalar_f32("metric_scale"), want.metric_scale);

    // npz_binary with the image as the body and the options in the query: float16 normals
    // (tt-MoGe's layout) and the JSON fields in X-MoGe-Meta.
    let r = post(&format!("{}/predict?output_format=npz_binary&num_tokens=300&fov_x=60", s.url), "image/png", &photo);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("application/x-npz"));
    let meta: Value = serde_json::from_str(r.header("x-moge-meta").expect("X-MoGe-Meta")).unwrap();
    assert_eq!(meta["metric_scale"].as_f64().unwrap() as f32, want.metric_scale);
    assert!(meta.get("outputs").is_none());
    let (header, data) = npy_entry(&r.body, "normal");
    assert!(header.contains("'descr': '<f2'") && header.contains("(48, 64, 3)"), "{header}");
    let halves: Vec<u16> = data.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    let expect: Vec<u16> = want.normal.as_ref().unwrap().iter().map(|&x| half::f16::from_f32(x).to_bits()).collect();
    assert_eq!(halves, expect);
    let (_d, mut z) = npz(&r.body);
    assert!(same_f32(&z.vec_f32("depth"), &want.depth));

    // png: the PNG encodings of `moge batch --format png`.
    let r = post_json(&s, &serde_json::json!({"image": b64(&photo), "output_format": "png", "num_tokens": 300, "fov_x": 60}));
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["encoding"]["depth_png_scale"].as_f64().unwrap() as f32, 0.001);
    let depth = image::load_from_memory(&unb64(&v["outputs"]["depth_png16"])).unwrap().into_luma16();
    assert_eq!(depth.as_raw(), &moge::outputs::png::encode_depth(&want, 0.001).0);
    let normal = image::load_from_memory(&unb64(&v["outputs"]["normal_png"])).unwrap().into_rgb8();
    assert_eq!(normal.as_raw(), &moge::geometry::codes::encode_normal(want.normal.as_ref().unwrap()));
    let mask = image::load_from_memory(&unb64(&v["outputs"]["mask_png"])).unwrap().into_luma8();
    assert_eq!(mask.as_raw(), &want.mask.iter().map(|&m| if m { 255 } else { 0 }).collect::<Vec<u8>>());

    // json: nested lists, null where the value is not finite.
    let r = post_json(&s, &serde_json::json!({"image": b64(&photo), "output_format": "json", "num_tokens": 300, "fov_x": 60}));
    assert_eq!(r.status, 200);
    let v = r.json();
    let d = &v["outputs"]["depth"];
    assert_eq!((d.as_array().unwrap().len(), d[0].as_array().unwrap().len()), (48, 64));
    let i = want.mask.iter().position(|&m| !m).unwrap();
    let j = want.mask.iter().position(|&m| m).unwrap();
    assert!(d[i / 64][i % 64].is_null());
    assert_eq!(d[j / 64][j % 64].as_f64().unwrap() as f32, want.depth[j]);
    assert_eq!(v["outputs"]["points"][j / 64][j % 64][2].as_f64().unwrap() as f32, want.points[3 * j + 2]);
    assert_eq!(v["outputs"]["mask"][j / 64][j % 64].as_u64(), Some(1));

    // fit pad onto a canvas: outputs at the photo's size.
    let r = post_json(&s, &serde_json::json!({"image": b64(&photo), "fit": "pad", "num_tokens": 300}));
    assert_eq!(r.status, 200);
    assert_eq!((r.json()["width"].as_u64(), r.json()["fit"].as_str()), (Some(64), Some("pad")));
}

#[test]
fn bad_requests_get_a_json_error_naming_the_problem() {
    let s = Server::start(&["--max-body-mb", "1"]);
    let url = format!("{}/predict", s.url);
    let cases: Vec<(Reply, u16, &str)> = vec![
        (post(&url, "application/json", br#"{"image": "not base64!"}"#), 400, "base64"),
        (post(&url, "application/json", br#"{"output_format": "npz"}"#), 400, "missing \"image\""),
        (post_json(&s, &serde_json::json!({"image": b64(&photo_png(64, 48)), "output_format": "exr"})), 400, "exr"),
        (post_json(&s, &serde_json::json!({"image": b64(&photo_png(64, 48)), "fov": 60})), 400, "unknown field `fov`"),
        (post_json(&s, &serde_json::json!({"image": b64(&photo_png(64, 48)), "num_tokens": 20000})), 400, "limit"),
        (post_json(&s, &serde_json::json!({"image": b64(&photo_png(64, 48)), "refine_steps": 2})), 400, "no refiner"),
        (post_json(&s, &serde_json::json!({"image": b64(&photo_png(64, 48)), "refine_steps": 17})), 400, "refine_steps 17"),
        (post(&url, "image/png", b"these bytes are no image"), 400, "not an image"),
        (post(&url, "image/jpeg", &photo_jpeg(64, 48)[..400]), 400, "truncated JPEG"),
        (post(&format!("{url}?output_format=json"), "image/png", &photo_png(600, 500)), 422, "512x512"),
    ];
    for (i, (r, status, needle)) in cases.iter().enumerate() {
        assert_eq!(r.status, *status, "case {i}: {}", String::from_utf8_lossy(&r.body));
        assert!(r.error().contains(needle), "case {i}: {:?} lacks {needle:?}", r.error());
    }
    // Too large: refused from its Content-Length, before the body is read (a raw request, since
    // the server answers and closes while a client would still be sending).
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(c, "POST /predict HTTP/1.1\r\nHost: {}\r\nContent-Type: image/png\r\nContent-Length: 1200000\r\n\r\n", s.addr).unwrap();
    let answer = read_answer(&mut c);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("limit of 1000000 bytes"), "{answer}");
    assert_eq!(get(&format!("{}/nowhere", s.url)).status, 404);
    // Still serving.
    let r = post(&format!("{url}?num_tokens=300"), "image/png", &photo_png(64, 48));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

/// Starts a request whose body is still arriving: it holds its place in the queue.
fn open_request(addr: &str, body: &[u8], sent: usize) -> TcpStream {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(c, "POST /predict?num_tokens=300 HTTP/1.1\r\nHost: {addr}\r\nContent-Type: image/png\r\nContent-Length: {}\r\n\r\n", body.len()).unwrap();
    c.write_all(&body[..sent]).unwrap();
    c.flush().unwrap();
    c
}

/// A request held in progress by its half-sent body, with the queue's one place: polls (bounded)
/// until another request is refused with 503. The held request may lose the race for the place
/// to a poll (it is then refused itself, and answered at once): it is opened again.
fn hold(s: &Server, photo: &[u8]) -> (TcpStream, Reply) {
    let t = Instant::now();
    let mut held = open_request(&s.addr, photo, 10);
    loop {
        let r = post(&format!("{}/predict?num_tokens=300", s.url), "image/png", &photo_png(64, 48));
        if r.status == 503 {
            return (held, r);
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no 503 within 30 s: {} {}", r.status, String::from_utf8_lossy(&r.body));
        held.set_nonblocking(true).unwrap();
        let answered = held.peek(&mut [0u8; 1]).is_ok();
        held.set_nonblocking(false).unwrap();
        if answered {
            held = open_request(&s.addr, photo, 10);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A whole HTTP answer from a raw connection: the head, then Content-Length bytes of body.
fn read_answer(c: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap()))
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return text;
            }
        }
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return text,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn read_status(c: &mut TcpStream) -> String {
    let mut line = String::new();
    BufReader::new(c).read_line(&mut line).unwrap();
    line
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let s = Server::start(&["--queue", "1"]);
    let photo = photo_png(64, 48);
    let (mut first, busy) = hold(&s, &photo);
    assert_eq!(busy.status, 503, "{}", String::from_utf8_lossy(&busy.body));
    assert_eq!(busy.header("retry-after"), Some("1"));
    assert!(busy.error().contains("--queue"), "{}", busy.error());
    // The first completes, and its place is free again.
    first.write_all(&photo[10..]).unwrap();
    assert!(read_status(&mut first).starts_with("HTTP/1.1 200"));
    let r = post(&format!("{}/predict?num_tokens=300", s.url), "image/png", &photo);
    assert_eq!(r.status, 200);
}

#[test]
fn sigterm_finishes_the_request_in_progress_then_exits_0() {
    let mut s = Server::start(&["--queue", "1"]);
    let photo = photo_png(64, 48);
    let (mut first, busy) = hold(&s, &photo);
    assert_eq!(busy.status, 503);
    s.sigterm();
    // New connections are refused once the listener is closed (bounded wait).
    let t = Instant::now();
    while TcpStream::connect(&s.addr).is_ok() {
        assert!(t.elapsed() < Duration::from_secs(20), "still accepting after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    first.write_all(&photo[10..]).unwrap();
    let status = read_status(&mut first);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    drop(first);
    let exit = s.wait(Duration::from_secs(30));
    assert_eq!(exit.code(), Some(0));
}

#[test]
fn a_taken_port_moves_to_the_next_free_one() {
    let a = Server::start(&[]);
    let port: u16 = a.addr.rsplit(':').next().unwrap().parse().unwrap();
    let b = Server::start(&["--port", &port.to_string()]);
    let port_b: u16 = b.addr.rsplit(':').next().unwrap().parse().unwrap();
    assert!(port_b > port, "{port_b} after {port}");
    assert_eq!(get(&format!("{}/health", b.url)).status, 200);
}

fn files(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).map(|r| r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default();
    v.sort();
    v
}

#[test]
fn batch_with_server_writes_what_a_local_batch_writes() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let photos = dir.path().join("photos");
    std::fs::create_dir(&photos).unwrap();
    std::fs::write(photos.join("a.png"), photo_png(64, 48)).unwrap();
    std::fs::write(photos.join("b.jpg"), photo_jpeg(40, 72)).unwrap();
    std::fs::write(photos.join("c.jpg"), &photo_jpeg(64, 48)[..500]).unwrap();
    let (local, remote) = (dir.path().join("local"), dir.path().join("remote"));
    let common = ["--num-tokens", "300", "--fov-x", "55", "--format", "npz,png,json"];
    let weights = fixtures().join("tiny_normal.pt");
    let out =
        run(&[&["batch", photos.to_str().unwrap(), "-o", local.to_str().unwrap(), "--precision", "f32", "--weights", weights.to_str().unwrap()][..], &common]
            .concat());
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&[&["batch", photos.to_str().unwrap(), "-o", remote.to_str().unwrap(), "--server", &s.url, "--in-flight", "2"][..], &common].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The cut JPEG fails here, named, before anything is sent; the others are done.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("c.jpg: truncated JPEG"), "{stderr}");
    assert!(stderr.contains("2 done, 1 failed"), "{stderr}");
    assert_eq!(files(&local), files(&remote));
    assert_eq!(
        files(&remote),
        ["a.depth.png", "a.json", "a.mask.png", "a.normal.png", "a.npz", "b.depth.png", "b.json", "b.mask.png", "b.normal.png", "b.npz"]
    );
    for name in ["a.npz", "a.depth.png", "a.normal.png", "a.mask.png", "b.npz", "b.depth.png", "b.normal.png"] {
        assert!(std::fs::read(local.join(name)).unwrap() == std::fs::read(remote.join(name)).unwrap(), "{name} differs");
    }
    let side = |d: &std::path::Path| -> Value { serde_json::from_slice(&std::fs::read(d.join("b.json")).unwrap()).unwrap() };
    let (l, r) = (side(&local), side(&remote));
    for k in ["width", "height", "intrinsics", "metric_scale", "depth", "fov_x"] {
        assert_eq!(l[k], r[k], "sidecar {k}");
    }
    assert_eq!(r["inference"]["server"]["url"].as_str(), Some(s.url.as_str()));
    assert_eq!(r["inference"]["server"]["model"].as_str(), Some("tiny_normal.pt"));
    assert_eq!(r["model"]["weights_sha256"], l["model"]["weights_sha256"]);
    assert!(r["inference"]["server"]["timing_ms"]["device"].as_f64().unwrap() > 0.0);

    // predict goes the same way.
    let one = dir.path().join("one");
    let out =
        run(&["predict", photos.join("a.png").to_str().unwrap(), "-o", one.to_str().unwrap(), "--server", &s.addr, "--num-tokens", "300", "--fov-x", "55"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("MoGeOutput(64x48"));
    assert!(std::fs::read(one.join("a.npz")).unwrap() == std::fs::read(local.join("a.npz")).unwrap());
}

#[test]
fn an_unreachable_server_is_one_clear_fatal_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.png"), photo_png(64, 48)).unwrap();
    let out_dir = dir.path().join("out");
    let out = run(&["batch", dir.path().to_str().unwrap(), "-o", out_dir.to_str().unwrap(), "--server", &format!("http://127.0.0.1:{port}")]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot reach the server at http://127.0.0.1:") && stderr.contains("connection refused"), "{stderr}");
    assert!(files(&out_dir).is_empty());
}

#[test]
fn a_server_that_dies_mid_batch_stops_it_with_nothing_half_written() {
    let mut s = Server::start(&["--queue", "1"]);
    let photo = photo_png(64, 48);
    // Holding the one place makes every request of the batch wait on 503 + Retry-After.
    let (_held, busy) = hold(&s, &photo);
    assert_eq!(busy.status, 503);
    let dir = tempfile::tempdir().unwrap();
    let photos = dir.path().join("photos");
    std::fs::create_dir(&photos).unwrap();
    for i in 0..3 {
        std::fs::write(photos.join(format!("p{i}.png")), photo_png(64 + i, 48)).unwrap();
    }
    let out_dir = dir.path().join("out");
    let batch = moge()
        .args(["batch", photos.to_str().unwrap(), "-o", out_dir.to_str().unwrap(), "--server", &s.url, "--server-retries", "4", "--format", "npz,png"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let _ = s.child.kill();
    s.wait(Duration::from_secs(10));
    let out = batch.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("moge: stopped:") && stderr.contains("cannot reach the server"), "{stderr}");
    assert!(stderr.contains("p0.png") || stderr.contains("p1.png") || stderr.contains("p2.png"), "{stderr}");
    // Nothing at all was written: no outputs, no temporary files.
    assert!(files(&out_dir).iter().all(|f| !f.contains(".npz") && !f.contains(".png")), "{:?}", files(&out_dir));
}

/// A client chooses the token grid of each request (`num_tokens`, and the photo's aspect): the
/// per-grid cache of position embeddings keeps the last `GRIDS_CACHED` grids, not one per grid
/// ever seen, and a grid that comes back after its eviction is computed again to the same bits.
#[test]
fn varied_grids_keep_the_per_grid_cache_bounded() {
    let s = Server::start(&[]);
    let photo = photo_png(64, 48);
    let tokens: Vec<u32> = (0..24).map(|i| 100 + 23 * i).collect();
    let grids: std::collections::HashSet<_> = tokens.iter().map(|&n| moge::model::token_grid(64, 48, n)).collect();
    let cap = moge::model::GRIDS_CACHED.get();
    assert!(grids.len() > 2 * cap, "{} grids are too few to overflow the cache", grids.len());
    let predict = |n: u32| {
        let r = post(&format!("{}/predict?output_format=npz_binary&num_tokens={n}", s.url), "image/png", &photo);
        assert_eq!(r.status, 200, "{}", r.error());
        r.body
    };
    let first = predict(tokens[0]);
    for &n in &tokens[1..] {
        predict(n);
        let cached = get(&format!("{}/info", s.url)).json()["cached_grids"].as_u64().unwrap() as usize;
        assert!(cached <= cap, "{cached} grids cached after num_tokens {n}, more than {cap}");
    }
    assert_eq!(get(&format!("{}/info", s.url)).json()["cached_grids"].as_u64(), Some(cap as u64));
    assert!(predict(tokens[0]) == first, "the first grid, computed again after its eviction, gave other bytes");
}

/// The samples of a Prometheus text exposition: `name{labels}` to value.
fn samples(text: &str) -> std::collections::HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {l:?}"));
            (name.to_owned(), value.parse().unwrap_or_else(|_| panic!("not a value: {l:?}")))
        })
        .collect()
}

#[test]
fn metrics_count_the_requests_that_were_made() {
    let s = Server::start(&["--warmup"]);
    let m = get(&format!("{}/metrics", s.url));
    assert_eq!(m.status, 200);
    assert!(m.header("content-type").unwrap().starts_with("application/openmetrics-text"));
    let before = samples(std::str::from_utf8(&m.body).unwrap());
    assert_eq!(before["moge_ready"], 1.0);
    // The warm-up is no request.
    assert_eq!(before["moge_request_duration_seconds_count"], 0.0);
    assert_eq!(before["moge_images_total"], 0.0);

    let photo = photo_png(64, 48);
    for _ in 0..3 {
        assert_eq!(post_json(&s, &serde_json::json!({"image": b64(&photo), "output_format": "npz_binary"})).status, 200);
    }
    assert_eq!(post_json(&s, &serde_json::json!({"image": b64(b"not an image")})).status, 400);
    let text = String::from_utf8(get(&format!("{}/metrics", s.url)).body).unwrap();
    let after = samples(&text);
    assert_eq!(after["moge_requests_total{status=\"200\"}"], 3.0, "{text}");
    assert_eq!(after["moge_requests_total{status=\"400\"}"], 1.0, "{text}");
    assert_eq!(after["moge_images_total"], 3.0);
    assert_eq!(after["moge_request_duration_seconds_count"], 4.0);
    assert_eq!(after["moge_device_duration_seconds_count"], 3.0);
    assert!(after["moge_device_duration_seconds_sum"] > 0.0);
    assert!(after["moge_request_duration_seconds_sum"] >= after["moge_device_duration_seconds_sum"]);
    // Every request counted falls in the last bucket; none is still in progress.
    assert_eq!(after["moge_request_duration_seconds_bucket{le=\"+Inf\"}"], 4.0, "{text}");
    assert_eq!(after["moge_requests_in_progress"], 0.0);
    assert_eq!(after["moge_device_queue_depth"], 0.0);
    assert!(text.trim_end().ends_with("# EOF"));
}

#[test]
fn health_is_503_until_the_model_is_loaded_and_warm() {
    use moge::server::{self, Phase, Service};
    let service = Service::new();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = server::app(service.clone());
    let serving = rt.spawn(async move {
        axum::serve(listener, app).with_graceful_shutdown(async move { drop(stopped.await) }).await.unwrap();
    });

    let check = |status: u16, phase: &str| {
        let h = get(&format!("{url}/health"));
        assert_eq!((h.status, h.json()["status"].as_str().unwrap()), (status, phase));
        if status == 503 {
            assert_eq!(h.header("retry-after"), Some("1"));
        }
        let live = get(&format!("{url}/health/live"));
        assert_eq!((live.status, live.json()["phase"].as_str().unwrap()), (200, phase));
    };
    check(503, "loading");
    let refused = post(&format!("{url}/predict"), "image/png", &photo_png(32, 24));
    assert_eq!(refused.status, 503);
    assert!(refused.error().contains("not ready: loading"));
    assert_eq!(get(&format!("{url}/info")).status, 503);

    let weights = fixtures().join("tiny_normal.pt");
    let model = std::sync::Arc::new(moge::Model::load(&weights, &moge::model::BuildOptions::default()).unwrap());
    let cfg = server::Config {
        model_id: "tiny".into(),
        weights,
        decode: Default::default(),
        canvas: moge::fit::Canvas { width: 320, height: 240 },
        depth_png_scale: 0.001,
        npz_compression: Default::default(),
        jobs: 1,
        queue: 2,
        max_body: 1 << 20,
        body_timeout: Duration::from_secs(10),
        max_tokens: 10_000,
    };
    service.load(model, cfg);
    assert_eq!(service.phase(), Phase::WarmingUp);
    check(503, "warming up");
    assert_eq!(post(&format!("{url}/predict"), "image/png", &photo_png(32, 24)).status, 503);
    assert!(service.warm_up().unwrap() > 0.0);
    service.ready();
    check(200, "ok");
    assert_eq!(post(&format!("{url}/predict"), "image/png", &photo_png(32, 24)).status, 200);
    let text = String::from_utf8(get(&format!("{url}/metrics")).body).unwrap();
    assert_eq!(samples(&text)["moge_requests_total{status=\"503\"}"], 2.0, "{text}");
    assert_eq!(samples(&text)["moge_ready"], 1.0);

    service.stopping();
    check(503, "stopping");
    assert_eq!(samples(&String::from_utf8(get(&format!("{url}/metrics")).body).unwrap())["moge_ready"], 0.0);
    let _ = stop.send(());
    rt.block_on(serving).unwrap();
    service.close();
}

/// A MoGe-3 server: `refine_steps` in the JSON and in the query string, each answer the
/// library's numbers for the same photo and steps, and a `moge predict --server` client asking
/// for steps gets the same depth as the library.
#[test]
fn a_moge3_server_takes_refine_steps() {
    let weights = fixtures().join("moge3/tiny_moge3.pt");
    let s = Server::start_with(&weights, &[]);
    let photo = photo_png(64, 48);
    let model = moge::Model::load(&weights, &moge::model::BuildOptions::default()).unwrap();
    let rgb = moge::image_io::decode_bytes(&photo, &Default::default()).unwrap().image;
    let mut depths = vec![];
    for steps in [0u32, 1, 3] {
        let r = post(&format!("{}/predict?num_tokens=60&refine_steps={steps}", s.url), "image/png", &photo);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let (_d, mut z) = npz(&unb64(&r.json()["outputs"]["npz"]));
        let want = model.infer(&rgb, &moge::InferOptions { num_tokens: Some(60), refine_steps: Some(steps), ..Default::default() }).unwrap();
        assert!(same_f32(&z.vec_f32("depth"), &want.depth), "refine_steps {steps}: the server's depth is not the library's");
        depths.push(want.depth);
    }
    assert!(depths[0] != depths[1] && depths[1] != depths[2], "each step changes the depth");
    // The default is upstream's 3 steps.
    let r = post_json(&s, &serde_json::json!({"image": b64(&photo), "num_tokens": 60}));
    let (_d, mut z) = npz(&unb64(&r.json()["outputs"]["npz"]));
    assert!(same_f32(&z.vec_f32("depth"), &depths[2]), "the default is 3 steps");

    // A client of the server sends its --refine-steps.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("p.png");
    std::fs::write(&input, &photo).unwrap();
    let out = crate::support::cli::moge()
        .args(["predict", "--server", &s.url, "--num-tokens", "60", "--refine-steps", "1", "--format", "npz", "-o"])
        .arg(dir.path().join("out"))
        .arg(&input)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut z = Npz::open(&dir.path().join("out/p.npz"));
    assert!(same_f32(&z.vec_f32("depth"), &depths[1]), "the client's answer is one step's");
}

/// `POST /predict_panorama` answers with `moge panorama`'s npz for the same photo and options
/// (views of 512 pixels); a photo that is not a panorama is a 400 that says why.
#[test]
fn a_panorama_is_answered_with_the_commands_npz() {
    let s = Server::start(&[]);
    let path = fixtures().join("images/pano_384x192.png");
    let png = std::fs::read(&path).unwrap();
    let r = post(&format!("{}/predict_panorama?num_tokens=300", s.url), "image/png", &png);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("application/x-npz"));
    let meta: Value = serde_json::from_str(r.header("x-moge-meta").unwrap()).unwrap();
    assert_eq!((meta["width"].as_u64(), meta["height"].as_u64()), (Some(384), Some(192)));
    let dir = tempfile::tempdir().unwrap();
    let tiny = fixtures().join("tiny_normal.pt");
    let o = run(&[
        "panorama",
        path.to_str().unwrap(),
        "-o",
        dir.path().to_str().unwrap(),
        "--weights",
        tiny.to_str().unwrap(),
        "--precision",
        "f32",
        "--num-tokens",
        "300",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_keep, mut served) = npz(&r.body);
    let mut made = Npz::open(&dir.path().join("pano_384x192.npz"));
    for k in ["points", "depth", "view_metric_scale"] {
        assert!(same_f32(&served.vec_f32(k), &made.vec_f32(k)), "{k} differs from moge panorama's");
    }
    assert_eq!(served.u8("mask"), made.u8("mask"));
    assert_eq!(meta["metric_scale"].as_f64().unwrap() as f32, made.scalar_f32("metric_scale"));

    let r = post(&format!("{}/predict_panorama", s.url), "image/png", &photo_png(64, 48));
    assert_eq!(r.status, 400);
    assert!(r.error().contains("twice its height"), "{}", r.error());
    let r = post(&format!("{}/predict_panorama?fov_x=60", s.url), "image/png", &png);
    assert_eq!(r.status, 400);
    assert!(r.error().contains("fov_x"), "{}", r.error());
    // As /predict: a MoGe-2 server has no refiner to run.
    let r = post(&format!("{}/predict_panorama?refine_steps=2", s.url), "image/png", &png);
    assert_eq!(r.status, 400);
    assert!(r.error().contains("no refiner"), "{}", r.error());
}

#[test]
fn the_page_and_its_files_are_served_from_the_binary() {
    let s = Server::start(&[]);
    let page = get(&format!("{}/", s.url));
    assert_eq!(page.status, 200);
    assert!(page.header("content-type").is_some_and(|c| c.starts_with("text/html")));
    // Nothing from elsewhere: the page's policy allows only this server.
    let csp = page.header("content-security-policy").unwrap_or_default().to_owned();
    assert!(csp.contains("default-src 'self'") && csp.contains("connect-src 'self'"), "{csp}");
    let html = String::from_utf8(page.body).unwrap();
    assert!(!html.contains("http://") && !html.contains("https://"), "the page links outside the server");
    // Every file the page loads is there, with its media type; a module's imports too.
    let mut files: Vec<String> = html.split("\"/page/").skip(1).map(|r| r.split('"').next().unwrap().to_owned()).collect();
    let mut seen = Vec::new();
    while let Some(name) = files.pop() {
        if seen.contains(&name) {
            continue;
        }
        let r = get(&format!("{}/page/{name}", s.url));
        assert_eq!(r.status, 200, "{name}");
        let media = if name.ends_with(".js") { "text/javascript" } else { "text/css" };
        assert!(r.header("content-type").is_some_and(|c| c.starts_with(media)), "{name}: {:?}", r.header("content-type"));
        let body = String::from_utf8(r.body).unwrap();
        files.extend(body.split("from \"./").skip(1).map(|r| r.split('"').next().unwrap().to_owned()));
        seen.push(name);
    }
    assert!(seen.len() >= 7, "{seen:?}");
    for missing in ["nope.js", "index.html", "..%2Fmod.rs"] {
        assert_eq!(get(&format!("{}/page/{missing}", s.url)).status, 404, "{missing}");
    }
    // The page writes depth PNGs at the server's scale.
    let info = get(&format!("{}/info", s.url)).json();
    assert_eq!(info["depth_png_scale"].as_f64(), Some(0.001f32 as f64));
}
