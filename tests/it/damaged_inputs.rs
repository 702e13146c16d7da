//! Photos as they arrive in real folders: cut short by an interrupted copy, damaged, or with a
//! header that claims a gigantic size. Each is a failed input with one line that names it and
//! says what is wrong; nothing is written for it; the rest of the batch is done.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::cli::moge;
use crate::support::own_process::own_process;
use crate::support::paths::{corpus, fixtures};
use crate::support::png::chunk;

/// The photos of the decode corpus: every format, as the fuzzer's seeds.
fn photos() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(corpus("decode")).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    assert!(v.len() >= 15, "the decode corpus holds every format");
    v
}

/// `moge ARGS` with the tiny fixture model at 100 tokens.
fn run_tiny(args: &[&str]) -> Output {
    moge().args(args).args(["--num-tokens", "100", "--weights"]).arg(fixtures().join("tiny_normal.pt")).output().unwrap()
}

fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr).lines().map(str::to_owned).collect()
}

#[test]
fn truncated_photos_of_every_format_fail_by_name_and_the_rest_is_done() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let mut cut: BTreeMap<String, &'static str> = BTreeMap::new();
    let mut whole = Vec::new();
    for p in photos() {
        let bytes = std::fs::read(&p).unwrap();
        let name = p.file_name().unwrap().to_str().unwrap().to_owned();
        let ext = p.extension().unwrap().to_str().unwrap();
        let kind = match ext {
            "jpg" => "JPEG",
            "png" => "PNG",
            "webp" => "WebP",
            "tif" => "TIFF",
            "bmp" => "BMP",
            other => panic!("{other}"),
        };
        std::fs::write(input.join(&name), &bytes).unwrap();
        whole.push(p.file_stem().unwrap().to_str().unwrap().to_owned());
        // As an interrupted copy leaves them: half, and all but the last byte.
        for (tag, n) in [("half", bytes.len() / 2), ("end", bytes.len() - 1)] {
            let cut_name = format!("{tag}_{name}");
            std::fs::write(input.join(&cut_name), &bytes[..n]).unwrap();
            cut.insert(cut_name, kind);
        }
    }
    let out_dir = dir.path().join("out");
    let out = run_tiny(&["batch", input.to_str().unwrap(), "-o", out_dir.to_str().unwrap(), "--quiet", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = stderr_lines(&out);
    for (name, kind) in &cut {
        let mine: Vec<&String> = lines.iter().filter(|l| l.contains(&format!("/{name}:"))).collect();
        assert_eq!(mine.len(), 1, "{name}: one line expected in {lines:#?}");
        assert!(mine[0].contains(&format!("truncated {kind}")), "{name}: {}", mine[0]);
        assert!(mine[0].contains("ends at byte"), "{name}: {}", mine[0]);
        let stem = Path::new(name).file_stem().unwrap().to_str().unwrap();
        assert!(!out_dir.join(format!("{stem}.npz")).exists(), "{name}: an output was written");
    }
    for stem in &whole {
        assert!(out_dir.join(format!("{stem}.npz")).is_file(), "{stem}: the whole photo was not done");
    }
    // The JSON lines say the same.
    let failed = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("\"status\":\"failed\"")).count();
    assert_eq!(failed, cut.len());
    // Nothing but the whole photos' outputs (no temporary files).
    let written = std::fs::read_dir(&out_dir).unwrap().count();
    assert_eq!(written, whole.len());
}

#[test]
fn the_jpeg_line_says_where_the_data_ends() {
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read(corpus("decode").join("baseline_exif6.jpg")).unwrap();
    let p = dir.path().join("cut.jpg");
    std::fs::write(&p, &src[..1000]).unwrap();
    let out = run_tiny(&["predict", p.to_str().unwrap(), "-o", dir.path().join("o").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let lines = stderr_lines(&out);
    assert_eq!(lines, vec![format!("moge: {}: truncated JPEG: image data ends at byte 1000 without the end-of-image marker", p.display())]);
}

#[test]
fn allow_truncated_processes_them_with_a_warning_each() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let base = corpus("decode");
    for (name, keep) in [("progressive.jpg", 0.9), ("rgb.png", 1.0), ("lossy.webp", 1.0)] {
        let b = std::fs::read(base.join(name)).unwrap();
        // PNG and WebP lose only their last bytes: the pixels are complete, the file is not.
        let n = if keep < 1.0 { (b.len() as f64 * keep) as usize } else { b.len() - 2 };
        std::fs::write(input.join(name), &b[..n]).unwrap();
    }
    let out_dir = dir.path().join("out");
    let out = run_tiny(&["batch", input.to_str().unwrap(), "-o", out_dir.to_str().unwrap(), "--quiet", "--allow-truncated"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    for (name, stem) in [("progressive.jpg", "progressive"), ("rgb.png", "rgb"), ("lossy.webp", "lossy")] {
        assert!(lines.iter().any(|l| l.starts_with("moge: warning: ") && l.contains(name) && l.contains("truncated")), "{name}: {lines:#?}");
        assert!(out_dir.join(format!("{stem}.npz")).is_file());
    }
}

/// A valid PNG header and one empty IDAT claiming `w` x `h` pixels.
fn png_claiming(w: u32, h: u32) -> Vec<u8> {
    let mut ihdr = Vec::new();
    ihdr.extend(w.to_be_bytes());
    ihdr.extend(h.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend(chunk(b"IHDR", &ihdr));
    out.extend(chunk(b"IDAT", &[0x78, 0x9C, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]));
    out.extend(chunk(b"IEND", &[]));
    out
}

/// Runs `moge` and returns its output and its own peak RSS in MiB (wait4's rusage). Linux counts
/// in a process's peak the one of the address space its exec replaced, which for a spawned
/// child is this process's: the test that calls this runs in a small process of its own.
fn run_measured(args: &[&str]) -> (i32, String, f64) {
    // Reaped by wait4 below, which also gives its rusage.
    #[allow(clippy::zombie_processes)]
    let child = moge()
        .args(args)
        .args(["--num-tokens", "100", "--weights"])
        .arg(fixtures().join("tiny_normal.pt"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut stderr = child.stderr.unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).unwrap();
        s
    });
    let mut status = 0;
    // SAFETY: rusage is a C struct of integers, for which all zeros is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to locals that outlive the call; `pid` is the child spawned
    // above, which nothing else waits for.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid);
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -1 };
    (code, reader.join().unwrap(), usage.ru_maxrss as f64 / 1024.0)
}

#[test]
fn a_decompression_bomb_is_refused_before_decoding_and_the_limit_can_be_raised() {
    if !own_process("damaged_inputs::a_decompression_bomb_is_refused_before_decoding_and_the_limit_can_be_raised", &[]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bomb = dir.path().join("bomb.png");
    std::fs::write(&bomb, png_claiming(100_000, 100_000)).unwrap();
    // A JPEG whose frame header claims 65000 x 65000.
    let mut jpg = std::fs::read(corpus("decode").join("progressive.jpg")).unwrap();
    let sof = jpg.windows(2).position(|w| w[0] == 0xFF && (w[1] == 0xC0 || w[1] == 0xC2)).unwrap();
    jpg[sof + 5..sof + 9].copy_from_slice(&[0xFD, 0xE8, 0xFD, 0xE8]);
    let jbomb = dir.path().join("bomb.jpg");
    std::fs::write(&jbomb, &jpg).unwrap();
    let o = dir.path().join("o");
    for (p, dims) in [(&bomb, "100000x100000 (10000.0 megapixels)"), (&jbomb, "65000x65000 (4225.0 megapixels)")] {
        let (code, err, rss) = run_measured(&["predict", p.to_str().unwrap(), "-o", o.to_str().unwrap()]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(dims) && err.contains("over the limit of 250 megapixels (--max-megapixels raises it)"), "{err}");
        assert!(rss < 400.0, "peak RSS {rss:.0} MiB: something was allocated for the claimed size");
    }
    // Raised past the claim, the header is believed and the decoder finds no data: still a
    // clean failure, not an attempt to allocate 30 GB.
    let (code, err, rss) = run_measured(&["predict", bomb.to_str().unwrap(), "-o", o.to_str().unwrap(), "--max-megapixels", "20000"]);
    assert_eq!(code, 1, "{err}");
    assert!(!err.contains("over the limit") && err.contains("bomb.png"), "{err}");
    assert!(rss < 400.0, "peak RSS {rss:.0} MiB");
    // And the option really sets the limit, for small photos too.
    let (code, err, _) =
        run_measured(&["predict", fixtures().join("images/rgb_64x48.png").to_str().unwrap(), "-o", o.to_str().unwrap(), "--max-megapixels", "0.001"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("64x48") && err.contains("over the limit of 0.001 megapixels"), "{err}");
}

/// The start of an ISO base media file: an `ftyp` box of `major` and `compatible` brands, then
/// the start of a `meta` box (what a phone's HEIC or a browser's AVIF begins with).
fn iso_media(major: &[u8; 4], compatible: &[&[u8; 4]]) -> Vec<u8> {
    let size = 16 + 4 * compatible.len();
    let mut v = (size as u32).to_be_bytes().to_vec();
    v.extend(b"ftyp");
    v.extend(major);
    v.extend(0u32.to_be_bytes());
    for b in compatible {
        v.extend(*b);
    }
    v.extend(12u32.to_be_bytes());
    v.extend(b"meta");
    v.extend([0u8; 4]);
    v
}

#[test]
fn heic_and_avif_photos_are_found_and_each_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let photos_dir = dir.path().join("phone");
    std::fs::create_dir(&photos_dir).unwrap();
    std::fs::copy(fixtures().join("images/rgb_64x48.png"), photos_dir.join("ok.png")).unwrap();
    std::fs::write(photos_dir.join("IMG_0001.HEIC"), iso_media(b"heic", &[b"mif1", b"heic"])).unwrap();
    // An AVIF whose major brand is the generic image brand: the compatible list says AVIF.
    std::fs::write(photos_dir.join("shot.avif"), iso_media(b"mif1", &[b"avif", b"mif1", b"miaf"])).unwrap();
    let out_dir = dir.path().join("out");
    let out = run_tiny(&["batch", photos_dir.to_str().unwrap(), "-o", out_dir.to_str().unwrap()]);
    let lines = stderr_lines(&out);
    assert_eq!(out.status.code(), Some(1), "{lines:?}");
    // A build with the `heif` feature reads these headers and finds them cut short; one without
    // says what to build or convert.
    let said = |name: &str, kind: &str| {
        lines.iter().any(|l| {
            l.contains(name)
                && if cfg!(feature = "heif") {
                    l.contains(&format!("truncated {kind}")) || l.contains(&format!("damaged {kind}"))
                } else {
                    l.contains(&format!("a {kind} photo, which this build of moge does not decode"))
                        && l.contains("--features heif")
                        && l.contains("heif-convert")
                }
        })
    };
    assert!(said("IMG_0001.HEIC", "HEIC/HEIF"), "{lines:?}");
    assert!(said("shot.avif", "AVIF"), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("1 done, 2 failed")), "{lines:?}");
    assert!(out_dir.join("ok.npz").exists() && !out_dir.join("IMG_0001.npz").exists() && !out_dir.join("shot.npz").exists());
}
