//! `moge batch --server A --server B ...`: a pool of servers, over loopback only. Real `moge serve`
//! processes on the tiny fixture model for the outputs and for servers that die; stand-in servers
//! that take a fixed time per photo for the spreading, so that the two cores do not decide it.
//! Every server is started by its test and stopped at its end; every wait is bounded.

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::cli::{moge, run, wait_bounded};
use crate::support::npz::Npz;
use crate::support::paths::fixtures;
use crate::support::serve::Server;
use crate::support::stand_in::StandIn;

fn photo_png(w: u32, h: u32, seed: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, ((x * 7 + y * 13 + seed * 29) % 256) as u8]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// `n` photos of a few sizes in `dir/photos`, two folders deep.
fn photos(dir: &Path, n: u32, w: u32, h: u32) -> PathBuf {
    let root = dir.join("photos");
    for i in 0..n {
        let sub = root.join(format!("set{}", i % 3));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join(format!("p{i:02}.png")), photo_png(w + 8 * (i % 4), h + 4 * (i % 3), i)).unwrap();
    }
    root
}

/// Every file under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<String> {
    // A directory not made yet holds nothing.
    let mut v: Vec<String> = walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| e.path().strip_prefix(dir).unwrap().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn count(dir: &Path, ext: &str) -> usize {
    tree(dir).iter().filter(|f| f.ends_with(ext)).count()
}

/// The outputs of `a` and `b` are the same files, the npz and PNG bit for bit and the sidecars'
/// geometry equal.
fn assert_same_outputs(a: &Path, b: &Path) {
    assert_eq!(tree(a), tree(b));
    for f in tree(a) {
        let (x, y) = (std::fs::read(a.join(&f)).unwrap(), std::fs::read(b.join(&f)).unwrap());
        if f.ends_with(".json") {
            let (x, y): (Value, Value) = (serde_json::from_slice(&x).unwrap(), serde_json::from_slice(&y).unwrap());
            for k in ["width", "height", "intrinsics", "metric_scale", "depth", "fov_x", "fov_y"] {
                assert_eq!(x[k], y[k], "{f}: {k}");
            }
        } else {
            assert!(x == y, "{f} differs");
        }
    }
}

fn batch(photos: &Path, out: &Path, extra: &[&str]) -> Child {
    moge().args(["batch", photos.to_str().unwrap(), "-o", out.to_str().unwrap(), "--quiet"]).args(extra).stderr(Stdio::piped()).spawn().unwrap()
}

fn finish(child: Child, limit: Duration) -> Output {
    let mut child = child;
    wait_bounded(&mut child, limit, "moge batch");
    child.wait_with_output().unwrap()
}

/// Polls (every 5 ms, at most 60 s) until `dir` holds `n` files ending in `ext`.
fn wait_for(dir: &Path, ext: &str, n: usize) {
    let t = Instant::now();
    while count(dir, ext) < n {
        assert!(t.elapsed() < Duration::from_secs(60), "{n} {ext} files never appeared in {}", dir.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The server URL each sidecar under `dir` names.
fn answered_by(dir: &Path) -> Vec<String> {
    tree(dir)
        .iter()
        .filter(|f| f.ends_with(".json"))
        .map(|f| {
            let v: Value = serde_json::from_slice(&std::fs::read(dir.join(f)).unwrap()).unwrap();
            v["inference"]["server"]["url"].as_str().unwrap_or_else(|| panic!("{f}: no server url")).to_owned()
        })
        .collect()
}

const FORMATS: &[&str] = &["--format", "npz,png,json", "--num-tokens", "600"];

#[test]
fn a_pool_of_three_servers_writes_what_a_local_run_writes_even_when_one_dies() {
    let mut servers: Vec<Server> = (0..3).map(|_| Server::start(&[])).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path(), 40, 160, 120);
    let local = dir.path().join("local");
    let weights = fixtures().join("tiny_normal.pt");
    let out =
        run(&[&["batch", photos.to_str().unwrap(), "-o", local.to_str().unwrap(), "--precision", "f32", "--weights", weights.to_str().unwrap()], FORMATS]
            .concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(count(&local, ".npz"), 40);

    // All three up: the comma list and the repeated flag give one pool.
    let pooled = dir.path().join("pooled");
    let list = format!("{},{}", urls[0], urls[1]);
    let out = finish(batch(&photos, &pooled, &[&["--server", &list, "--server", &urls[2], "--in-flight", "2"], FORMATS].concat()), Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_same_outputs(&local, &pooled);
    let by = answered_by(&pooled);
    for u in &urls {
        assert!(by.iter().any(|b| b == u), "{u} answered none of the photos: {by:?}");
    }

    // One killed once the batch is under way: every photo still done, the same, and the dead
    // server named once.
    let survived = dir.path().join("survived");
    let child = batch(&photos, &survived, &[&["--server", &urls.join(","), "--in-flight", "1"], FORMATS].concat());
    wait_for(&survived, ".npz", 4);
    let _ = servers[1].child.kill();
    servers[1].wait(Duration::from_secs(10));
    let out = finish(child, Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_same_outputs(&local, &survived);
    let named: Vec<&str> = stderr.lines().filter(|l| l.contains(urls[1].as_str())).collect();
    assert_eq!(named.len(), 1, "{stderr}");
    assert!(named[0].contains("taken out of the pool (2 of 3 servers left)"), "{stderr}");
    let by = answered_by(&survived);
    assert_eq!(by.len(), 40);
    assert!(by.iter().all(|b| urls.contains(b)), "{by:?}");
    // The photo that found the server gone was sent again, and its sidecar says so.
    assert!(resent_from(&survived).iter().any(|r| r == &[urls[1].clone()]), "{:?}", resent_from(&survived));
}

/// The `resent_from` list of each sidecar under `dir` that has one.
fn resent_from(dir: &Path) -> Vec<Vec<String>> {
    tree(dir)
        .iter()
        .filter(|f| f.ends_with(".json"))
        .filter_map(|f| {
            let v: Value = serde_json::from_slice(&std::fs::read(dir.join(f)).unwrap()).unwrap();
            let r = v["inference"]["server"].get("resent_from")?.as_array()?.iter().map(|u| u.as_str().unwrap().to_owned()).collect();
            Some(r)
        })
        .collect()
}

#[test]
fn a_server_that_does_not_answer_in_time_is_taken_out_and_its_photo_sent_elsewhere() {
    let hung = StandIn::start(Duration::from_secs(60));
    let good = StandIn::start(Duration::from_millis(50));
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path(), 12, 48, 32);
    let out_dir = dir.path().join("out");
    let urls = format!("{},{}", hung.url(), good.url());
    let t = Instant::now();
    let out =
        finish(batch(&photos, &out_dir, &["--server", &urls, "--in-flight", "1", "--server-timeout", "1", "--format", "npz,json"]), Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // One timeout, not one per retry: the photo went elsewhere at once.
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert!(stderr.contains(&format!("no answer from the server at {}/predict within 1.0 s: taken out", hung.url())), "{stderr}");
    assert_eq!(count(&out_dir, ".npz"), 12);
    assert!(answered_by(&out_dir).iter().all(|u| *u == good.url()));
    // The hung server may be probed back (its /health answers) and fail a photo again before
    // the batch ends: each such photo was sent on to the good one.
    let resent = resent_from(&out_dir);
    assert!(!resent.is_empty() && resent.iter().all(|r| *r == [hung.url()]), "{resent:?}");
    assert_eq!(good.requests(), 12);
}

#[test]
fn when_every_server_dies_the_batch_stops_with_nothing_half_written() {
    let mut servers: Vec<Server> = (0..3).map(|_| Server::start(&[])).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path(), 60, 160, 120);
    let out_dir = dir.path().join("out");
    let child = batch(&photos, &out_dir, &[&["--server", &urls.join(","), "--in-flight", "1"], FORMATS].concat());
    wait_for(&out_dir, ".npz", 3);
    for s in &mut servers {
        let _ = s.child.kill();
        s.wait(Duration::from_secs(10));
    }
    let out = finish(child, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let stopped = stderr.lines().find(|l| l.starts_with("moge: stopped:")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(stopped.contains("no server of the pool answers"), "{stderr}");
    for u in &urls {
        assert!(stopped.contains(u.as_str()), "{u} not named: {stderr}");
        // Taken out once, with one warning; a photo that failed on every server may name it
        // again in its own error line, which is not a second warning.
        let warned = format!("moge: warning: cannot reach the server at {u}");
        assert_eq!(stderr.lines().filter(|l| l.starts_with(&warned)).count(), 1, "{stderr}");
    }
    // What was written is whole: no temporary file, each photo's outputs all there, each npz
    // readable; and not every photo was done.
    let files = tree(&out_dir);
    assert!(files.iter().all(|f| !f.contains("moge-tmp")), "{files:?}");
    let npz: Vec<&String> = files.iter().filter(|f| f.ends_with(".npz")).collect();
    assert!(npz.len() >= 3 && npz.len() < 60, "{} npz", npz.len());
    for f in npz {
        let stem = f.trim_end_matches(".npz");
        for kind in [".json", ".depth.png", ".normal.png", ".mask.png"] {
            assert!(files.contains(&format!("{stem}{kind}")), "{stem}{kind} missing");
        }
        assert_eq!(Npz::open(&out_dir.join(f)).f32("depth").ndim(), 2);
    }
}

#[test]
fn a_server_that_comes_back_is_used_again() {
    let a = StandIn::start(Duration::from_millis(100));
    // B's port is free: B is not there when the batch starts.
    let b_addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let b_url = format!("http://{b_addr}");
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path(), 30, 48, 32);
    let out_dir = dir.path().join("out");
    let child = batch(&photos, &out_dir, &["--server", &format!("{},{b_url}", a.url()), "--in-flight", "1", "--format", "npz,json"]);
    wait_for(&out_dir, ".npz", 3);
    let b = StandIn::start_on(b_addr, Duration::from_millis(100)).unwrap();
    let out = finish(child, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains(&format!("cannot reach the server at {b_url}")), "{stderr}");
    assert!(stderr.contains(&format!("the server at {b_url} answers again: back in the pool")), "{stderr}");
    assert_eq!(count(&out_dir, ".npz"), 30);
    assert!(b.requests() > 0, "B was never used");
    assert_eq!(a.requests() + b.requests(), 30);
    let by = answered_by(&out_dir);
    assert_eq!(by.iter().filter(|u| **u == b_url).count(), b.requests());
}

#[test]
fn four_servers_finish_a_batch_at_least_3x_faster_than_one() {
    // Long enough that starting the client and connecting (which both runs pay) stay small.
    let delay = Duration::from_millis(300);
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path(), 24, 32, 24);
    let timed = |servers: &[StandIn], out: &str| {
        let urls: Vec<String> = servers.iter().map(StandIn::url).collect();
        let t = Instant::now();
        let out = finish(batch(&photos, &dir.path().join(out), &["--server", &urls.join(","), "--in-flight", "1", "--format", "npz"]), Duration::from_secs(60));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        t.elapsed()
    };
    let one = [StandIn::start(delay)];
    let t1 = timed(&one, "one");
    let four: Vec<StandIn> = (0..4).map(|_| StandIn::start(delay)).collect();
    let t4 = timed(&four, "four");
    assert_eq!(one[0].requests(), 24);
    // The least loaded server takes each photo: with one request each, they take turns.
    for s in &four {
        assert!((5..=7).contains(&s.requests()), "{:?}", four.iter().map(StandIn::requests).collect::<Vec<_>>());
    }
    let speedup = t1.as_secs_f64() / t4.as_secs_f64();
    assert!(speedup >= 3.0, "one server {t1:?}, four {t4:?}: {speedup:.2}x");
}

#[test]
fn servers_that_run_different_models_are_refused() {
    let real = Server::start(&[]);
    let stand_in = StandIn::start(Duration::ZERO);
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path(), 1, 32, 24);
    let out_dir = dir.path().join("out");
    let out = finish(batch(&photos, &out_dir, &["--server", &format!("{},{}", real.url, stand_in.url())]), Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("the servers of the pool run different models"), "{stderr}");
    assert!(stderr.contains("tiny_normal.pt") && stderr.contains(&stand_in.url()), "{stderr}");
    assert_eq!(stand_in.requests(), 0);
    assert_eq!(count(&out_dir, ".npz"), 0);
}

#[test]
fn a_photo_every_server_fails_on_fails_alone() {
    // Both servers hang on every photo: each photo is tried once per server, then fails with
    // the reason, rather than going round for ever.
    let (a, b) = (StandIn::start(Duration::from_secs(60)), StandIn::start(Duration::from_secs(60)));
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path(), 2, 48, 32);
    let out_dir = dir.path().join("out");
    let urls = format!("{},{}", a.url(), b.url());
    let out = finish(batch(&photos, &out_dir, &["--server", &urls, "--in-flight", "1", "--server-timeout", "1"]), Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for p in ["p00.png", "p01.png"] {
        assert!(stderr.lines().any(|l| l.contains(p) && l.contains("2 attempts on the pool's servers failed on this photo: no answer")), "{stderr}");
    }
    assert_eq!(count(&out_dir, ".npz"), 0);
}
