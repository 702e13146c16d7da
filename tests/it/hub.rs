//! Weights from the hub, for real but without the internet: the `moge` binary against a fake hub
//! on 127.0.0.1 (support/hub_server.rs), with HF_HOME in a temporary folder.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::support::cli::{moge, wait_bounded};
use crate::support::hub_server::{Behaviour, FakeHub, COMMIT};

const MODEL: &str = "vits-normal";
const REPO: &str = "Ruicheng/moge-2-vits-normal";
const REPO_DIR: &str = "models--Ruicheng--moge-2-vits-normal";

#[derive(Debug)]
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// A home folder and Hugging Face cache of its own.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        Self { dir: tempfile::tempdir().unwrap() }
    }

    fn hf_home(&self) -> PathBuf {
        self.dir.path().join("hf")
    }

    fn cache(&self) -> PathBuf {
        self.hf_home().join("hub")
    }

    fn repo_dir(&self) -> PathBuf {
        self.cache().join(REPO_DIR)
    }

    fn pointer(&self, commit: &str) -> PathBuf {
        self.repo_dir().join("snapshots").join(commit).join("model.pt")
    }

    fn blob_names(&self) -> Vec<String> {
        let mut names: Vec<String> =
            fs::read_dir(self.repo_dir().join("blobs")).map(|d| d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default();
        names.sort();
        names
    }

    /// Runs `moge ARGS` with only this test's hub variables, and a deadline.
    fn run(&self, endpoint: &str, args: &[&str], vars: &[(&str, &str)]) -> Out {
        self.run_with(endpoint, args, vars, false)
    }

    /// As `run`; with `close_stdout`, the reader of stdout goes away at once (`| head -0`).
    fn run_with(&self, endpoint: &str, args: &[&str], vars: &[(&str, &str)], close_stdout: bool) -> Out {
        let mut cmd = moge();
        for v in [
            "HF_HOME",
            "HF_HUB_CACHE",
            "HF_ENDPOINT",
            "HF_HUB_OFFLINE",
            "HF_TOKEN",
            "XDG_CACHE_HOME",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            cmd.env_remove(v);
        }
        cmd.env("HOME", self.dir.path()).env("HF_HOME", self.hf_home()).env("HF_ENDPOINT", endpoint);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut child = cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let drain = |mut r: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = r.read_to_string(&mut s);
                s
            })
        };
        let stdout = child.stdout.take().unwrap();
        let stdout = if close_stdout {
            drop(stdout);
            std::thread::spawn(String::new)
        } else {
            drain(Box::new(stdout))
        };
        let stderr = drain(Box::new(child.stderr.take().unwrap()));
        let status = wait_bounded(&mut child, Duration::from_secs(60), &format!("moge {args:?}"));
        Out { code: status.code().unwrap_or(-1), stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
    }
}

/// An endpoint where nothing listens.
fn dead_endpoint() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    url
}

fn assert_one_clean_line(out: &Out) {
    assert!(!out.stderr.contains("panicked"), "{out:?}");
    assert_eq!(out.stderr.trim().lines().count(), 1, "one line expected: {out:?}");
}

fn info_json(env: &Env, endpoint: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let mut a = vec!["info", "--json"];
    a.extend_from_slice(args);
    let out = env.run(endpoint, &a, &[]);
    assert_eq!(out.code, 0, "{out:?}");
    serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap().as_array().unwrap().clone()
}

fn entry<'a>(list: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    list.iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("{name} not in {list:?}"))
}

#[test]
fn download_fills_the_standard_cache_layout() {
    let hub = FakeHub::start(REPO, Behaviour::default());
    let env = Env::new();
    let out = env.run(&hub.url, &["download", "--model", MODEL], &[]);
    assert_eq!(out.code, 0, "{out:?}");

    let blob = env.repo_dir().join("blobs").join(&hub.sha256);
    assert_eq!(fs::read(&blob).unwrap(), hub.payload);
    // Only the blob: no .incomplete left behind.
    assert_eq!(env.blob_names(), vec![hub.sha256.clone()]);
    let pointer = env.pointer(COMMIT);
    assert_eq!(fs::read_link(&pointer).unwrap(), Path::new("../../blobs").join(&hub.sha256));
    assert_eq!(fs::read(&pointer).unwrap(), hub.payload);
    assert_eq!(fs::read_to_string(env.repo_dir().join("refs/main")).unwrap(), COMMIT);
    // The lock sits where huggingface_hub keeps its own.
    assert!(env.cache().join(".locks").join(REPO_DIR).join(format!("{}.lock", hub.sha256)).is_file());

    assert!(out.stdout.contains(&pointer.display().to_string()), "{out:?}");
    assert!(out.stdout.contains(&hub.sha256) && out.stdout.contains("downloaded"), "{out:?}");
    let reqs = hub.requests();
    let methods: Vec<&str> = reqs.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(methods, ["HEAD", "GET"]);
    assert!(reqs.iter().all(|r| r.path == format!("/{REPO}/resolve/main/model.pt")), "{reqs:?}");
    assert_eq!(reqs[1].range, None, "a fresh download asks for the whole file");
}

#[test]
fn a_cached_model_is_not_fetched_again_and_info_lists_it() {
    let hub = FakeHub::start(REPO, Behaviour::default());
    let env = Env::new();
    assert_eq!(env.run(&hub.url, &["download", "--model", MODEL], &[]).code, 0);
    let again = env.run(&hub.url, &["download", "--model", MODEL], &[]);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.stdout.contains("already cached"), "{again:?}");
    assert_eq!(hub.gets().len(), 1, "the second download only asks the hub which file is current");

    let pointer = env.pointer(COMMIT).display().to_string();
    let info = env.run(&hub.url, &["info"], &[]);
    assert_eq!(info.code, 0, "{info:?}");
    assert!(info.stdout.contains(&env.cache().display().to_string()), "{info:?}");
    let line = info.stdout.lines().find(|l| l.starts_with(MODEL)).unwrap();
    assert!(line.contains(REPO) && line.contains("cached,"), "{info:?}");
    assert!(info.stdout.contains(&pointer) && info.stdout.contains(&hub.sha256), "{info:?}");
    let vitl = info.stdout.lines().find(|l| l.starts_with("vitl ")).unwrap();
    assert!(vitl.contains("not cached") && vitl.contains("moge download --model vitl"), "{info:?}");
    assert_eq!(env.run(&hub.url, &["models"], &[]).stdout, info.stdout, "`models` is `info`");

    let list = info_json(&env, &hub.url, &[]);
    assert_eq!(list.len(), 6, "four MoGe-2 models and two MoGe-3");
    assert_eq!(entry(&list, "moge3-vitl")["repo"], "Ruicheng/moge-3-vitl");
    assert_eq!(entry(&list, "moge3-vitg")["repo"], "Ruicheng/moge-3-vitg");
    let e = entry(&list, MODEL);
    assert_eq!(e["repo"], REPO);
    assert_eq!(e["cached"], true);
    assert_eq!(e["path"], pointer.as_str());
    assert_eq!(e["size"], hub.payload.len() as u64);
    assert_eq!(e["sha256"], hub.sha256.as_str());
    assert_eq!(e["commit"], COMMIT);
    let v = entry(&list, "vitl-normal");
    assert_eq!(v["cached"], false);
    assert!(v["path"].is_null() && v["sha256"].is_null(), "{v}");
    assert_eq!(v["repo_dir"], env.cache().join("models--Ruicheng--moge-2-vitl-normal").display().to_string().as_str());
    assert_eq!(hub.gets().len(), 1, "info does not download");
}

#[test]
fn offline_mode_uses_the_cache_and_never_asks_the_hub() {
    let hub = FakeHub::start(REPO, Behaviour::default());
    let env = Env::new();
    assert_eq!(env.run(&hub.url, &["download", "--model", MODEL], &[]).code, 0);
    let before = hub.requests().len();

    let offline = [("HF_HUB_OFFLINE", "1")];
    let out = env.run(&hub.url, &["download", "--model", MODEL], &offline);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("HF_HUB_OFFLINE") && out.stdout.contains(&hub.sha256), "{out:?}");
    // predict resolves to the cached file and gets as far as loading it (the payload is no checkpoint).
    let out = env.run(&hub.url, &["predict", "photo.jpg", "--model", MODEL], &offline);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains(&env.pointer(COMMIT).display().to_string()), "{out:?}");
    assert!(!out.stderr.contains("not in the Hugging Face cache"), "{out:?}");
    assert_eq!(hub.requests().len(), before, "no request while offline");
}

#[test]
fn offline_without_a_cached_copy_is_one_clear_line() {
    let hub = FakeHub::start(REPO, Behaviour::default());
    let env = Env::new();
    for args in [&["predict", "photo.jpg", "--model", MODEL][..], &["download", "--model", MODEL]] {
        let out = env.run(&hub.url, args, &[("HF_HUB_OFFLINE", "1")]);
        assert_eq!(out.code, 2, "{out:?}");
        assert_one_clean_line(&out);
        for part in [MODEL, REPO, "HF_HUB_OFFLINE", "moge download --model vits-normal", "--weights PATH"] {
            assert!(out.stderr.contains(part), "missing '{part}': {out:?}");
        }
        assert!(out.stderr.contains(&env.cache().display().to_string()), "{out:?}");
    }
    assert!(hub.requests().is_empty(), "{:?}", hub.requests());
}

#[test]
fn no_network_and_no_cached_copy_is_one_clear_line() {
    let env = Env::new();
    let endpoint = dead_endpoint();
    for args in [&["predict", "photo.jpg", "--model", MODEL][..], &["download", "--model", MODEL]] {
        let out = env.run(&endpoint, args, &[]);
        assert_eq!(out.code, 2, "{out:?}");
        assert_one_clean_line(&out);
        for part in [endpoint.as_str(), MODEL, REPO, "not in the cache", "moge download --model vits-normal", "--weights PATH"] {
            assert!(out.stderr.contains(part), "missing '{part}': {out:?}");
        }
        assert!(out.stderr.contains(&env.cache().display().to_string()), "{out:?}");
    }
}

#[test]
fn no_network_with_a_cached_copy_keeps_working() {
    let hub = FakeHub::start(REPO, Behaviour::default());
    let env = Env::new();
    assert_eq!(env.run(&hub.url, &["download", "--model", MODEL], &[]).code, 0);
    let endpoint = dead_endpoint();
    let out = env.run(&endpoint, &["download", "--model", MODEL], &[]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("cannot reach the hub") && out.stdout.contains(&hub.sha256), "{out:?}");
    // predict does not even try the hub when the file is cached.
    let out = env.run(&endpoint, &["predict", "photo.jpg", "--model", MODEL], &[]);
    assert!(out.stderr.contains(&env.pointer(COMMIT).display().to_string()), "{out:?}");
    assert!(!out.stderr.contains("cannot reach"), "{out:?}");
}

#[test]
fn a_missing_file_is_a_clear_404() {
    let hub = FakeHub::start(REPO, Behaviour { missing: true, ..Default::default() });
    let env = Env::new();
    let out = env.run(&hub.url, &["download", "--model", MODEL, "--revision", "v9"], &[]);
    assert_eq!(out.code, 2, "{out:?}");
    assert_one_clean_line(&out);
    for part in ["HTTP 404", REPO, "revision v9", "--revision", hub.url.as_str()] {
        assert!(out.stderr.contains(part), "missing '{part}': {out:?}");
    }
    assert!(env.blob_names().is_empty());
    assert!(!env.repo_dir().join("snapshots").exists());
}

#[test]
fn a_corrupted_download_is_deleted_and_never_cached() {
    let hub = FakeHub::start(REPO, Behaviour { corrupt: true, ..Default::default() });
    let env = Env::new();
    let out = env.run(&hub.url, &["download", "--model", MODEL], &[]);
    assert_eq!(out.code, 2, "{out:?}");
    let last = out.stderr.trim().lines().last().unwrap();
    assert!(last.contains("sha256") && last.contains(&hub.sha256) && last.contains("deleted"), "{out:?}");
    assert!(env.blob_names().is_empty(), "neither blob nor partial file: {:?}", env.blob_names());
    assert!(!env.pointer(COMMIT).exists() && !env.repo_dir().join("refs/main").exists());
    assert_eq!(entry(&info_json(&env, &hub.url, &[]), MODEL)["cached"], false);
    // A later run must not find anything to load either.
    let out = env.run(&hub.url, &["predict", "photo.jpg", "--model", MODEL], &[("HF_HUB_OFFLINE", "1")]);
    assert!(out.stderr.contains("is not in the Hugging Face cache"), "{out:?}");
}

#[test]
fn a_dropped_connection_leaves_nothing_loadable_and_the_next_run_resumes() {
    // Every attempt of the run (3) is cut half-way.
    let flaky = FakeHub::start(REPO, Behaviour { drops: 3, ..Default::default() });
    let env = Env::new();
    let out = env.run(&flaky.url, &["download", "--model", MODEL], &[]);
    assert_eq!(out.code, 2, "{out:?}");
    let last = out.stderr.trim().lines().last().unwrap();
    assert!(last.contains("interrupted") && last.contains(".incomplete") && last.contains("run the command again"), "{out:?}");
    assert_eq!(env.blob_names(), vec![format!("{}.incomplete", flaky.sha256)], "only the partial file");
    assert!(!env.pointer(COMMIT).exists() && !env.repo_dir().join("refs/main").exists());

    // Each retry resumed where the last one stopped.
    let gets = flaky.gets();
    assert_eq!(gets.len(), 3, "{gets:?}");
    let starts: Vec<usize> =
        gets[1..].iter().map(|g| g.range.as_deref().and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok()).unwrap()).collect();
    assert!(gets[0].range.is_none() && 0 < starts[0] && starts[0] < starts[1], "{gets:?}");
    let partial = fs::read(env.repo_dir().join("blobs").join(format!("{}.incomplete", flaky.sha256))).unwrap();
    assert!(starts[1] < partial.len() && partial.len() < flaky.payload.len());
    assert_eq!(partial[..], flaky.payload[..partial.len()], "the partial file is a prefix of the file");
    drop(flaky);

    let good = FakeHub::start(REPO, Behaviour::default());
    let out = env.run(&good.url, &["download", "--model", MODEL], &[]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(good.gets().len(), 1);
    assert_eq!(good.gets()[0].range.as_deref(), Some(format!("bytes={}-", partial.len()).as_str()));
    assert_eq!(fs::read(env.pointer(COMMIT)).unwrap(), good.payload);
    assert_eq!(env.blob_names(), vec![good.sha256.clone()]);
}

#[test]
fn one_dropped_connection_is_resumed_within_the_run() {
    let hub = FakeHub::start(REPO, Behaviour { drops: 1, ..Default::default() });
    let env = Env::new();
    let out = env.run(&hub.url, &["download", "--model", MODEL], &[]);
    assert_eq!(out.code, 0, "{out:?}");
    let gets = hub.gets();
    assert_eq!(gets.len(), 2, "{gets:?}");
    let range = gets[1].range.clone().unwrap();
    assert!(range.starts_with("bytes=") && range != "bytes=0-", "{range}");
    assert_eq!(fs::read(env.pointer(COMMIT)).unwrap(), hub.payload);
}

#[test]
fn a_server_that_ignores_range_does_not_corrupt_a_resumed_download() {
    let hub = FakeHub::start(REPO, Behaviour { ignore_range: true, ..Default::default() });
    let env = Env::new();
    let blobs = env.repo_dir().join("blobs");
    fs::create_dir_all(&blobs).unwrap();
    // A partial file from an earlier run.
    fs::write(blobs.join(format!("{}.incomplete", hub.sha256)), &hub.payload[..5000]).unwrap();
    let out = env.run(&hub.url, &["download", "--model", MODEL], &[]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(hub.gets().len(), 1, "{:?}", hub.gets());
    assert_eq!(hub.gets()[0].range.as_deref(), Some("bytes=5000-"));
    assert_eq!(fs::read(env.pointer(COMMIT)).unwrap(), hub.payload, "the whole answer replaced the partial file");
}

#[test]
fn a_storage_redirect_like_the_real_hub_is_followed() {
    let hub = FakeHub::start(REPO, Behaviour { redirect_to_storage: true, ..Default::default() });
    let env = Env::new();
    let out = env.run(&hub.url, &["download", "--model", MODEL], &[]);
    assert_eq!(out.code, 0, "{out:?}");
    // Named by X-Linked-Etag (the sha256), not by the redirect's own ETag.
    assert_eq!(env.blob_names(), vec![hub.sha256.clone()]);
    assert_eq!(fs::read(env.pointer(COMMIT)).unwrap(), hub.payload);
    let storage = format!("/storage/{}", hub.sha256);
    assert!(hub.gets().iter().any(|g| g.path == storage), "{:?}", hub.requests());
}

#[test]
fn a_pinned_commit_is_cached_without_a_ref() {
    let hub = FakeHub::start(REPO, Behaviour::default());
    let env = Env::new();
    let out = env.run(&hub.url, &["download", "--model", MODEL, "--revision", COMMIT], &[]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(fs::read(env.pointer(COMMIT)).unwrap(), hub.payload);
    assert!(!env.repo_dir().join("refs").join(COMMIT).exists() && !env.repo_dir().join("refs/main").exists());
    assert_eq!(hub.requests()[0].path, format!("/{REPO}/resolve/{COMMIT}/model.pt"));

    assert_eq!(entry(&info_json(&env, &hub.url, &["--revision", COMMIT]), MODEL)["cached"], true);
    assert_eq!(entry(&info_json(&env, &hub.url, &[]), MODEL)["cached"], false, "main was never resolved");
    let out = env.run(&hub.url, &["predict", "x.jpg", "--model", MODEL, "--revision", COMMIT], &[("HF_HUB_OFFLINE", "1")]);
    assert!(out.stderr.contains(&env.pointer(COMMIT).display().to_string()), "{out:?}");
}

#[test]
fn the_token_comes_from_hf_token_or_the_token_file() {
    let hub = FakeHub::start(REPO, Behaviour { token: Some("hf_secret".into()), ..Default::default() });
    let env = Env::new();
    let out = env.run(&hub.url, &["download", "--model", MODEL], &[]);
    assert_eq!(out.code, 2, "{out:?}");
    assert_one_clean_line(&out);
    assert!(out.stderr.contains("HTTP 401") && out.stderr.contains("HF_TOKEN"), "{out:?}");

    let out = env.run(&hub.url, &["download", "--model", MODEL], &[("HF_TOKEN", "hf_secret")]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(hub.requests()[1..].iter().all(|r| r.authorization.as_deref() == Some("Bearer hf_secret")));

    // `huggingface-cli login` leaves the token in $HF_HOME/token.
    let env = Env::new();
    fs::create_dir_all(env.hf_home()).unwrap();
    fs::write(env.hf_home().join("token"), "hf_secret\n").unwrap();
    let out = env.run(&hub.url, &["download", "--model", MODEL], &[]);
    assert_eq!(out.code, 0, "{out:?}");
}

#[test]
fn info_verify_finds_a_damaged_cached_file() {
    let hub = FakeHub::start(REPO, Behaviour::default());
    let env = Env::new();
    assert_eq!(env.run(&hub.url, &["download", "--model", MODEL], &[]).code, 0);
    let out = env.run(&hub.url, &["info", "--verify"], &[]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("(verified)"), "{out:?}");

    let blob = env.repo_dir().join("blobs").join(&hub.sha256);
    let mut bytes = fs::read(&blob).unwrap();
    bytes[10] ^= 1;
    fs::write(&blob, bytes).unwrap();
    let out = env.run(&hub.url, &["info", "--verify"], &[]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("MISMATCH") && out.stdout.contains(&blob.display().to_string()), "{out:?}");
    let out = env.run(&hub.url, &["info", "--verify", "--json"], &[]);
    let list: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(entry(&list, MODEL)["verified"], false);
}

#[test]
fn the_cache_location_follows_the_huggingface_variables() {
    let env = Env::new();
    let home = env.dir.path();
    let cache_line = |vars: &[(&str, &str)]| {
        let out = env.run("http://127.0.0.1:9", &["info"], vars);
        assert_eq!(out.code, 0, "{out:?}");
        out.stdout.lines().next().unwrap().to_string()
    };
    let elsewhere = home.join("elsewhere");
    let xdg = home.join("xdg");
    let expect = |p: PathBuf| format!("Hugging Face cache: {}", p.display());
    assert_eq!(cache_line(&[]), expect(env.cache()));
    assert_eq!(cache_line(&[("HF_HUB_CACHE", elsewhere.to_str().unwrap())]), expect(elsewhere.clone()));
    // An empty HF_HOME counts as unset.
    assert_eq!(cache_line(&[("HF_HOME", ""), ("XDG_CACHE_HOME", xdg.to_str().unwrap())]), expect(xdg.join("huggingface/hub")));
    assert_eq!(cache_line(&[("HF_HOME", "")]), expect(home.join(".cache/huggingface/hub")));

    // And downloads go there.
    let hub = FakeHub::start(REPO, Behaviour::default());
    let out = env.run(&hub.url, &["download", "--model", MODEL], &[("HF_HUB_CACHE", elsewhere.to_str().unwrap())]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(fs::read(elsewhere.join(REPO_DIR).join("blobs").join(&hub.sha256)).unwrap(), hub.payload);
    assert!(!env.cache().exists());
}

#[test]
fn several_models_are_fetched_and_one_failure_fails_the_command() {
    // The fake hub only has vits-normal: vitl answers 404.
    let hub = FakeHub::start(REPO, Behaviour::default());
    let env = Env::new();
    let out = env.run(&hub.url, &["download", "--model", MODEL, "--model", "vitl", "--model", MODEL], &[]);
    assert_eq!(out.code, 2, "{out:?}");
    assert_eq!(out.stdout.lines().filter(|l| l.starts_with("vits-normal:")).count(), 1, "once each: {out:?}");
    let last = out.stderr.trim().lines().last().unwrap();
    assert!(last.contains("Ruicheng/moge-2-vitl ") && last.contains("HTTP 404"), "{out:?}");
    assert_eq!(fs::read(env.pointer(COMMIT)).unwrap(), hub.payload);
}

#[test]
fn more_bytes_than_announced_are_rejected() {
    let hub = FakeHub::start(REPO, Behaviour { short_size: true, ..Default::default() });
    let env = Env::new();
    let out = env.run(&hub.url, &["download", "--model", MODEL], &[]);
    assert_eq!(out.code, 2, "{out:?}");
    let last = out.stderr.trim().lines().last().unwrap();
    let sizes = format!("is {} bytes but the hub announced {}", hub.payload.len(), hub.payload.len() - 100);
    assert!(last.contains(&sizes) && last.contains("deleted"), "{out:?}");
    assert!(env.blob_names().is_empty() && !env.pointer(COMMIT).exists());
    assert_eq!(hub.gets().len(), 1, "no point retrying");
}

#[test]
fn a_partial_file_longer_than_the_file_is_started_over() {
    let hub = FakeHub::start(REPO, Behaviour::default());
    let env = Env::new();
    let blobs = env.repo_dir().join("blobs");
    fs::create_dir_all(&blobs).unwrap();
    let mut stale = hub.payload.clone();
    stale.extend_from_slice(b"junk");
    fs::write(blobs.join(format!("{}.incomplete", hub.sha256)), stale).unwrap();
    let out = env.run(&hub.url, &["download", "--model", MODEL], &[]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(hub.gets().len(), 1);
    assert_eq!(hub.gets()[0].range, None, "a fresh start, not a resume");
    assert_eq!(fs::read(env.pointer(COMMIT)).unwrap(), hub.payload);
}

#[test]
fn download_and_info_stop_printing_quietly_on_a_closed_stdout() {
    let hub = FakeHub::start(REPO, Behaviour::default());
    let env = Env::new();
    let out = env.run_with(&hub.url, &["download", "--model", MODEL], &[], true);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(!out.stderr.contains("panicked"), "{out:?}");
    // The download itself was finished and is usable.
    assert_eq!(fs::read(env.pointer(COMMIT)).unwrap(), hub.payload);
    for args in [&["info"][..], &["info", "--json"], &["info", "--verify"]] {
        let out = env.run_with(&hub.url, args, &[("HF_HUB_OFFLINE", "1")], true);
        assert_eq!(out.code, 0, "{args:?}: {out:?}");
        assert!(!out.stderr.contains("panicked"), "{args:?}: {out:?}");
    }
}
