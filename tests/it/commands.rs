//! What every command shares: the model options resolve the same way in each (one photo through
//! `predict` and `batch` gives byte-identical files at every precision), and no command panics
//! when the reader of its output goes away (`moge predict a b c | head -1`).
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::cli::{self, wait_bounded};
use crate::support::paths::fixtures;

/// `moge`, kept off the network.
fn moge() -> Command {
    let mut c = cli::moge();
    c.env("HF_HUB_OFFLINE", "1").env_remove("HF_ENDPOINT");
    c
}

#[test]
fn predict_and_batch_give_identical_files_at_every_precision() {
    let dir = tempfile::tempdir().unwrap();
    let photos = dir.path().join("photos");
    std::fs::create_dir(&photos).unwrap();
    std::fs::copy(fixtures().join("images/rgb_40x72.png"), photos.join("p.png")).unwrap();
    let weights = fixtures().join("tiny_normal_f16.pt");
    let w = weights.to_str().unwrap();
    let mut by_precision = Vec::new();
    for precision in ["f32", "bf16", "auto"] {
        let a = dir.path().join(format!("predict-{precision}"));
        let b = dir.path().join(format!("batch-{precision}"));
        let common = ["--weights", w, "--num-tokens", "400", "--precision", precision, "--format", "npz,png"];
        let out = moge().args(["predict", photos.join("p.png").to_str().unwrap(), "-o", a.to_str().unwrap()]).args(common).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let out = moge().args(["batch", photos.to_str().unwrap(), "-o", b.to_str().unwrap(), "--quiet"]).args(common).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for f in ["p.npz", "p.depth.png", "p.normal.png", "p.mask.png"] {
            let (x, y) = (std::fs::read(a.join(f)).unwrap(), std::fs::read(b.join(f)).unwrap());
            assert!(x == y, "{precision}: {f} differs between predict and batch");
        }
        by_precision.push(std::fs::read(a.join("p.npz")).unwrap());
    }
    // The option is honoured: bf16 is not f32, and auto is what this CPU's default says.
    assert_ne!(by_precision[0], by_precision[1], "--precision bf16 gave the f32 numbers");
    let auto_is_bf16 = moge::model::cpu::matmul::bf16::pays();
    assert_eq!(by_precision[2], by_precision[if auto_is_bf16 { 1 } else { 0 }]);
}

/// Runs `moge ARGS` with its stdout read for `keep` lines and then closed, as `| head -N` does.
/// Returns (exit code, stderr). Bounded: the command is killed after 120 s.
fn with_closed_stdout(args: &[&str], keep: usize) -> (i32, String) {
    let mut child = moge().args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    {
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        for _ in 0..keep {
            line.clear();
            if out.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
        }
    } // the reader goes away here
    let status = wait_bounded(&mut child, Duration::from_secs(120), &format!("moge {args:?}"));
    (status.code().unwrap_or(-1), err.join().unwrap())
}

fn photos(dir: &Path, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let p = dir.join(format!("img{i}.png"));
            std::fs::copy(fixtures().join("images/rgb_64x48.png"), &p).unwrap();
            p.to_str().unwrap().to_owned()
        })
        .collect()
}

#[test]
fn no_command_panics_on_a_closed_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = photos(dir.path(), 3);
    let w = fixtures().join("tiny_normal.pt");
    let w = w.to_str().unwrap();
    let out = dir.path().join("out");
    let o = out.to_str().unwrap();
    let tiny = ["--weights", w, "--num-tokens", "100"];

    // predict a b c | head -1: the first line is read, every photo is still done.
    let mut args = vec!["predict"];
    args.extend(imgs.iter().map(String::as_str));
    args.extend(["-o", o]);
    args.extend(tiny);
    let (code, err) = with_closed_stdout(&args, 1);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for i in 0..3 {
        assert!(out.join(format!("img{i}.npz")).is_file(), "img{i}.npz was not written");
    }

    let photos_dir = dir.path().to_str().unwrap().to_owned();
    let out2 = dir.path().join("out2");
    let cases: Vec<(Vec<&str>, usize, i32)> = vec![
        (vec!["batch", &photos_dir, "-o", out2.to_str().unwrap(), "--json", "--quiet"], 0, 0),
        (vec!["bench", "--runs", "1", "--size", "64x48"], 1, 0),
        (vec!["info"], 1, 0),
        (vec!["info", "--json"], 0, 0),
        (vec!["--help"], 0, 0),
        (vec!["predict", "--help"], 1, 0),
        (vec!["--version"], 0, 0),
    ];
    for (mut args, keep, want) in cases {
        if args[0] == "bench" {
            args.extend(tiny);
        }
        if args[0] == "batch" {
            args.extend(tiny);
        }
        let (code, err) = with_closed_stdout(&args, keep);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(code, want, "{args:?}: {err}");
    }
    assert_eq!(std::fs::read_dir(&out2).unwrap().filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "npz")).count(), 3);
}

#[test]
fn a_closed_stderr_does_not_panic_either() {
    // moge batch dir 2>&1 | head -1, where the failures go to stderr.
    let dir = tempfile::tempdir().unwrap();
    photos(dir.path(), 2);
    std::fs::write(dir.path().join("bad.png"), b"not a png at all").unwrap();
    let w = fixtures().join("tiny_normal.pt");
    let mut child = moge()
        .args(["batch", dir.path().to_str().unwrap(), "-o", dir.path().join("o").to_str().unwrap(), "--num-tokens", "100", "--weights"])
        .arg(&w)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let status = wait_bounded(&mut child, Duration::from_secs(120), "batch");
    assert_eq!(status.code(), Some(1), "one bad input: exit 1, not a panic (101)");
    assert!(dir.path().join("o/img0.npz").is_file() && dir.path().join("o/img1.npz").is_file());
}

/// `MOGE_MAX_CPU_ISA` caps the route `moge info` reports (and the kernels use); a value that
/// names no level is reported on stderr and ignored, and the command still works.
#[test]
fn max_cpu_isa_caps_the_route_and_an_unknown_value_is_ignored() {
    use moge::simd::isa;
    let info = |value: &str| {
        let out = moge().arg("info").env(isa::ENV, value).output().unwrap();
        assert!(out.status.success(), "{value}: {}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let detected = isa::detected();
    let (out, err) = info("Portable");
    assert!(out.contains(&format!("cpu route: portable (detected {detected}; MOGE_MAX_CPU_ISA=portable), precision f32")), "{out}");
    assert!(out.contains("cpu kernels: conv3x3 im2col, ") && out.contains("softmax/gelu portable"), "{out}");
    assert!(!err.contains("warning"), "{err}");
    // This architecture's top level and the one below it (x86-64: amx, avx512bf16; aarch64:
    // bf16, i8mm).
    let (top, below) = (isa::Isa::ALL[isa::Isa::ALL.len() - 1], isa::Isa::ALL[isa::Isa::ALL.len().saturating_sub(2)]);
    // A cap above the CPU never enables what it lacks.
    let (out, _) = info(top.name());
    assert!(out.contains(&format!("cpu route: {detected} (detected {detected}; MOGE_MAX_CPU_ISA={top})")), "{out}");
    // And one below it caps it (on an AMX CPU: the AVX512-BF16 products instead of the tiles).
    let (out, _) = info(below.name());
    let capped = detected.min(below);
    assert!(out.contains(&format!("cpu route: {capped} (detected {detected}; MOGE_MAX_CPU_ISA={below})")), "{out}");
    // On Arm from the NEON level, f32's wide 3x3 convolutions take the Winograd route, the
    // others the direct one.
    if cfg!(target_arch = "aarch64") {
        let (out, _) = info("neon");
        assert!(
            out.contains("cpu kernels: conv3x3 winograd f(2x2,3x3) neon (64+ channels;") && out.contains("), direct neon (fewer, fused upsample)"),
            "{out}"
        );
    }
    // Another architecture's level names nothing here.
    let foreign = if cfg!(target_arch = "aarch64") { "avx2" } else { "neon" };
    let (_, err) = info(foreign);
    assert!(err.contains(&format!("MOGE_MAX_CPU_ISA=\"{foreign}\" is not one of")), "{err}");
    let (out, err) = info("sse9");
    assert!(err.contains("MOGE_MAX_CPU_ISA") && err.contains(&isa::Isa::names()) && err.contains("sse9"), "{err}");
    assert_eq!(err.matches("MOGE_MAX_CPU_ISA").count(), 1, "warned once: {err}");
    assert!(out.contains(&format!("cpu route: {detected} (detected {detected}; MOGE_MAX_CPU_ISA=\"sse9\" ignored)")), "{out}");
}
