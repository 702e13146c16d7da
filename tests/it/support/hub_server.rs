//! A loopback HTTP server that answers like the Hugging Face hub for one `model.pt`:
//! `/{repo}/resolve/{main|commit}/model.pt` with HEAD and GET, Range, ETag (the sha256),
//! X-Repo-Commit, Content-Length; one connection per request (`Connection: close`).
//! It stops when dropped, and by itself after a minute.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::rng::Rng;

pub const COMMIT: &str = "5f1e4c2a9b7d3e8f0a6c1b2d4e3f5a7b9c0d1e2f";

/// A small stand-in for the weights (no checkpoint): its bytes do not matter, only that they are
/// checked. Its length is not a multiple of any buffer size, so a transfer ends mid-buffer.
fn payload() -> Vec<u8> {
    Rng::new(0x9e37_79b9).bytes(256 * 1024 + 123)
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// How the fake hub misbehaves.
#[derive(Clone, Default)]
pub struct Behaviour {
    /// Every path answers 404 (no such file at that revision).
    pub missing: bool,
    /// GET serves other bytes than the announced sha256.
    pub corrupt: bool,
    /// This many GETs send headers for the whole body, half of it, then close the connection.
    pub drops: usize,
    /// HEAD answers 302 to a storage URL with X-Linked-Etag / X-Linked-Size, as the real hub does for LFS files.
    pub redirect_to_storage: bool,
    /// GET ignores Range and always sends the whole file with 200.
    pub ignore_range: bool,
    /// HEAD announces a size 100 bytes short of what GET sends.
    pub short_size: bool,
    /// Requests without `Authorization: Bearer <token>` get 401.
    pub token: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

pub struct FakeHub {
    pub url: String,
    pub sha256: String,
    pub payload: Vec<u8>,
    log: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeHub {
    pub fn start(repo: &str, behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener.set_nonblocking(true).expect("nonblocking listener");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let payload = payload();
        let sha256 = sha256_hex(&payload);
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(State {
            repo: repo.to_string(),
            url: url.clone(),
            payload: payload.clone(),
            sha256: sha256.clone(),
            behaviour,
            drops_left: AtomicUsize::new(0),
            log: log.clone(),
        });
        state.drops_left.store(state.behaviour.drops, Ordering::SeqCst);
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !stop2.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => state.handle(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { url, sha256, payload, log, stop, thread: Some(thread) }
    }

    pub fn requests(&self) -> Vec<Request> {
        self.log.lock().unwrap().clone()
    }

    /// The GET requests, in order.
    pub fn gets(&self) -> Vec<Request> {
        self.requests().into_iter().filter(|r| r.method == "GET").collect()
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct State {
    repo: String,
    url: String,
    payload: Vec<u8>,
    sha256: String,
    behaviour: Behaviour,
    drops_left: AtomicUsize,
    log: Arc<Mutex<Vec<Request>>>,
}

impl State {
    fn handle(&self, mut s: TcpStream) {
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let Some(req) = read_request(&mut s) else { return };
        self.log.lock().unwrap().push(req.clone());
        let b = &self.behaviour;
        let file_paths = [format!("/{}/resolve/main/model.pt", self.repo), format!("/{}/resolve/{COMMIT}/model.pt", self.repo)];
        let storage_path = format!("/storage/{}", self.sha256);
        if let Some(t) = &b.token {
            if req.authorization.as_deref() != Some(&format!("Bearer {t}")) {
                return respond(&mut s, "401 Unauthorized", &[("X-Error-Code", "GatedRepo".into())], b"");
            }
        }
        if b.missing || !(file_paths.contains(&req.path) || (b.redirect_to_storage && req.path == storage_path)) {
            return respond(&mut s, "404 Not Found", &[("X-Error-Code", "EntryNotFound".into())], b"Entry not found");
        }
        if b.redirect_to_storage && req.path != storage_path {
            let headers = [
                ("Location", format!("{}{storage_path}", self.url)),
                ("X-Repo-Commit", COMMIT.into()),
                ("X-Linked-Etag", format!("\"{}\"", self.sha256)),
                ("X-Linked-Size", self.payload.len().to_string()),
                // The hub's own ETag of a redirect is the git pointer's, not the file's.
                ("ETag", "\"0000000000000000000000000000000000000000\"".into()),
            ];
            return respond(&mut s, "302 Found", &headers, b"");
        }
        let mut body = self.payload.clone();
        if b.corrupt {
            body[1000] ^= 0xff;
        }
        let len = body.len();
        let range = if b.ignore_range { None } else { req.range.as_deref().and_then(|r| parse_range(r, len)) };
        let (status, start, end) = match range {
            Some((a, e)) => ("206 Partial Content", a, e),
            None => ("200 OK", 0, len - 1),
        };
        let mut headers = vec![
            ("ETag", format!("\"{}\"", self.sha256)),
            ("X-Repo-Commit", COMMIT.into()),
            ("Accept-Ranges", "bytes".into()),
            ("Content-Length", (end + 1 - start).to_string()),
        ];
        if range.is_some() {
            headers.push(("Content-Range", format!("bytes {start}-{end}/{len}")));
        }
        let slice = &body[start..=end];
        if req.method == "HEAD" {
            if b.short_size {
                headers[3].1 = (len - 100).to_string();
            }
            return respond_head(&mut s, status, &headers);
        }
        let drop_now = self.drops_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if drop_now {
            respond_head(&mut s, status, &headers);
            let _ = s.write_all(&slice[..slice.len() / 2]);
            let _ = s.flush();
            let _ = s.shutdown(Shutdown::Both);
            return;
        }
        respond_head(&mut s, status, &headers);
        let _ = s.write_all(slice);
    }
}

fn read_request(s: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut chunk).ok()?;
        if n == 0 || buf.len() > 64 * 1024 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_string(), first.next()?.to_string());
    let header = |name: &str| {
        text.split("\r\n").skip(1).find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim().to_string()))
    };
    let range = header("range");
    let authorization = header("authorization");
    Some(Request { method, path, range, authorization })
}

/// `bytes=a-` or `bytes=a-b` → inclusive (a, b), clamped to the file.
fn parse_range(r: &str, len: usize) -> Option<(usize, usize)> {
    let (a, b) = r.strip_prefix("bytes=")?.split_once('-')?;
    let a: usize = a.parse().ok()?;
    let b: usize = if b.is_empty() { len - 1 } else { b.parse::<usize>().ok()?.min(len - 1) };
    (a <= b).then_some((a, b))
}

fn respond_head(s: &mut TcpStream, status: &str, headers: &[(&str, String)]) {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = s.write_all(head.as_bytes());
}

fn respond(s: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut h = headers.to_vec();
    h.push(("Content-Length", body.len().to_string()));
    respond_head(s, status, &h);
    let _ = s.write_all(body);
}
