//! A program that uses the library hears nothing from it on its standard streams: no progress
//! bar, no error or warning line, no JSON line, no note. What a run has to say comes back in its
//! records and its summary; the command line is the one that prints.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::support::own_process::own_process;
use crate::support::paths::fixtures;

/// The folder the test's own process writes its streams and its outputs into.
const DIR: &str = "MOGE_TEST_SILENT_DIR";

const NAME: &str = "silent::a_library_run_prints_nothing_on_stdout_or_stderr";

/// A whole run, as a program would make it: the model loaded, a good photo, a missing one and
/// a damaged one, with a camera matrix off the centre, whose view the command line notes, under an
/// unknown `MOGE_MAX_CPU_ISA` that the command line warns of. Its streams are caught at the file
/// descriptors (whatever writes them, Rust's or not), in a process of its own, so that the test
/// harness and the other tests write nothing into them.
#[test]
fn a_library_run_prints_nothing_on_stdout_or_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap().to_owned();
    if !own_process(NAME, &[(DIR, &path), ("MOGE_MAX_CPU_ISA", "sse9")]) {
        for stream in ["stdout", "stderr"] {
            let said = std::fs::read_to_string(dir.path().join(stream)).unwrap();
            assert!(said.is_empty(), "the library wrote on its {stream}:\n{said}");
        }
        let out = dir.path().join("out");
        assert!(out.join("rgb_64x48.npz").is_file() && out.join("rgb_64x48.json").is_file());
        assert!(!out.join("bad.npz").exists() && !out.join("missing.npz").exists());
        return;
    }
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let bad = dir.join("bad.png");
    std::fs::write(&bad, b"\x89PNG\r\n\x1a\nnot a png at all").unwrap();
    let photos = [fixtures().join("images/rgb_64x48.png"), dir.join("missing.png"), bad];
    let (summary, records) = caught(&dir, || {
        let opts = moge::LoadOptions { device: moge::DeviceRequest::Cpu, ..Default::default() };
        let model = Arc::new(moge::load(fixtures().join("tiny_normal.pt").to_str().unwrap(), &opts).unwrap());
        let inputs: Vec<moge::Input> = photos.iter().map(|p| moge::pipeline::inputs::file_input(p)).collect();
        let mut cfg = moge::Config::new(dir.join("out"));
        cfg.outputs.formats = vec![moge::outputs::Format::Npz, moge::outputs::Format::Json];
        cfg.plan.infer.num_tokens = Some(100);
        cfg.plan.fov = moge::image_io::FovFrom::Intrinsics(moge::camera::Pinhole::new([70.0, 75.0, 10.0, 30.0]).unwrap());
        cfg.stats = true;
        cfg.jobs = 2;
        let mut records = Vec::new();
        let summary = moge::run(moge::Engine::Local(model), inputs, &cfg, &Arc::new(AtomicBool::new(false)), |r| records.push(r));
        (summary, records)
    });
    assert_eq!((summary.total, summary.done, summary.failed, summary.skipped), (3, 1, 2, 0), "{summary:?}");
    assert!(summary.fatal.is_none() && !summary.interrupted);
    assert!(summary.forward_only.is_some_and(|(per, n)| per > 0.0 && n == 1), "{:?}", summary.forward_only);
    // What the command line would say beside the records is in the summary.
    assert!(
        matches!(summary.notices.as_slice(), [moge::console::Notice::Info(n)] if n.starts_with("note: the camera (fx 70 fy 75 cx 10 cy 30)") && n.contains("% of its tokens")),
        "{:?}",
        summary.notices
    );
    assert_eq!(records.len(), 3);
    for (name, failed) in [("rgb_64x48.png", false), ("missing.png", true), ("bad.png", true)] {
        let r = records.iter().find(|r| r.input.ends_with(name)).unwrap();
        assert_eq!(r.status == moge::Status::Failed, failed, "{r:?}");
        assert_eq!(r.error.as_ref().is_some_and(|e| e.contains(name)), failed, "{r:?}");
    }
}

/// `f()` with file descriptors 1 and 2 on `dir/stdout` and `dir/stderr`, put back after.
fn caught<T>(dir: &Path, f: impl FnOnce() -> T) -> T {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let files = ["stdout", "stderr"].map(|s| std::fs::File::create(dir.join(s)).unwrap());
    let _ = (std::io::stdout().flush(), std::io::stderr().flush());
    // SAFETY: dup and dup2 take and return descriptors only; 1 and 2 are open in a test process,
    // and the files stay open until the descriptors are put back.
    let kept = unsafe { [libc::dup(1), libc::dup(2)] };
    assert!(kept.iter().all(|&fd| fd >= 0));
    for (fd, file) in [1, 2].into_iter().zip(&files) {
        // SAFETY: `file` is open for the call and dup2 only copies the descriptor onto 1 or 2.
        let got = unsafe { libc::dup2(file.as_raw_fd(), fd) };
        assert_eq!(got, fd);
    }
    let out = f();
    let _ = (std::io::stdout().flush(), std::io::stderr().flush());
    for (fd, old) in [1, 2].into_iter().zip(kept) {
        // SAFETY: as above; `old` is the descriptor dup gave and is closed once put back.
        unsafe {
            assert_eq!(libc::dup2(old, fd), fd);
            libc::close(old);
        }
    }
    out
}
