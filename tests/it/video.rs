//! Videos through `moge batch`, made by ffmpeg in each test as a user's camera or editor would
//! (H.264 in MP4, VP9 in WebM, a moving synthetic scene): each frame's outputs equal those of
//! that frame extracted to PNG by ffmpeg and run as a photo; `--every` and `--fps` take the
//! right frames; `--skip-existing` resumes by frame; a video cut in half keeps its first
//! frames with a warning; ffmpeg missing is one line saying what to install. Needs ffmpeg on
//! PATH (`.ci/run` installs Debian's).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::cli::moge;
use crate::support::npz::Npz;
use crate::support::paths::fixtures;
use crate::support::serve::Server;

/// 20 frames at 10 fps of a scene that moves, in 96x64.
const FRAMES: u64 = 20;

fn ffmpeg(args: &[&str]) {
    let out = Command::new("ffmpeg")
        .args(["-nostdin", "-v", "error", "-y"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ffmpeg, which these tests need on PATH (Debian: apt install ffmpeg): {e}"));
    assert!(out.status.success(), "ffmpeg {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A clip as users have them: `codec` "h264" (MP4, the index at the front as phones and
/// editors write it for streaming) or "vp9" (WebM).
fn clip(dir: &Path, name: &str, codec: &str) -> PathBuf {
    let path = dir.join(name);
    let source = format!("testsrc2=size=96x64:rate=10:duration={}", FRAMES / 10);
    let enc: &[&str] = match codec {
        "h264" => &["-c:v", "libx264", "-pix_fmt", "yuv420p", "-movflags", "+faststart"],
        _ => &["-c:v", "libvpx-vp9", "-b:v", "200k"],
    };
    ffmpeg(&[&["-f", "lavfi", "-i", &source], enc, &[path.to_str().unwrap()]].concat());
    path
}

const MODEL: &[&str] = &["--format", "npz,json", "--num-tokens", "300", "--precision", "f32"];

fn batch(inputs: &[&Path], out: &Path, extra: &[&str]) -> Output {
    let weights = fixtures().join("tiny_normal.pt");
    let mut cmd = moge();
    cmd.arg("batch").args(inputs).args(["-o", out.to_str().unwrap(), "--weights", weights.to_str().unwrap()]).args(MODEL).args(extra);
    cmd.output().unwrap()
}

fn files(dir: &Path, ext: &str) -> Vec<String> {
    let mut v: Vec<String> = walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file() && e.path().to_string_lossy().ends_with(ext))
        .map(|e| e.path().strip_prefix(dir).unwrap().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn sidecar(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// The frame numbers written under `dir`.
fn frame_numbers(dir: &Path) -> Vec<u64> {
    files(dir, ".npz").iter().map(|f| Path::new(f).file_stem().unwrap().to_str().unwrap().parse().unwrap()).collect()
}

#[test]
fn each_frame_of_h264_and_vp9_videos_equals_that_frame_extracted_to_png() {
    let dir = tempfile::tempdir().unwrap();
    let mp4 = clip(dir.path(), "walk.mp4", "h264");
    let webm = clip(dir.path(), "pan.webm", "vp9");
    let out = dir.path().join("out");
    let o = batch(&[&mp4, &webm], &out, &["--json"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains(&format!("{} done, 0 failed", 2 * FRAMES)), "{stderr}");
    let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len() as u64, 2 * FRAMES);
    for (video, stem) in [(&mp4, "walk"), (&webm, "pan")] {
        assert_eq!(frame_numbers(&out.join(stem)), (0..FRAMES).collect::<Vec<_>>());
        // The frames as ffmpeg writes them to PNG, run as photos.
        let pngs = dir.path().join(format!("{stem}-png"));
        std::fs::create_dir_all(&pngs).unwrap();
        ffmpeg(&["-i", video.to_str().unwrap(), "-fps_mode", "passthrough", "-start_number", "0", pngs.join("%06d.png").to_str().unwrap()]);
        let reference = dir.path().join(format!("{stem}-ref"));
        let r = batch(&[&pngs], &reference, &[]);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        for i in 0..FRAMES {
            let name = format!("{i:06}");
            let (got, want) =
                (std::fs::read(out.join(stem).join(format!("{name}.npz"))).unwrap(), std::fs::read(reference.join(format!("{name}.npz"))).unwrap());
            assert!(got == want, "{stem} frame {i}: the npz differs from the PNG's");
            let s = sidecar(&out.join(stem).join(format!("{name}.json")));
            assert_eq!(s["input"], video.to_str().unwrap());
            assert_eq!(s["frame"]["index"], i);
            let t = s["frame"]["time_s"].as_f64().unwrap();
            assert!((t - i as f64 / 10.0).abs() < 1e-3, "{stem} frame {i} at {t} s");
            // The per-image JSON line names the frame too.
            assert!(lines.iter().any(|l| l["input"] == video.to_str().unwrap() && l["frame"]["index"] == i && l["status"] == "ok"));
        }
    }
}

#[test]
fn every_and_fps_take_the_right_frames_and_skip_existing_resumes_by_frame() {
    let dir = tempfile::tempdir().unwrap();
    let mp4 = clip(dir.path(), "clip.mp4", "h264");
    let every = dir.path().join("every");
    let o = batch(&[&mp4], &every, &["--every", "4"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(frame_numbers(&every.join("clip")), [0, 4, 8, 12, 16]);

    // 3 per second of a 10 fps video: the first frame at or after 0, 1/3, 2/3, 1, ... s.
    let fps = dir.path().join("fps");
    let o = batch(&[&mp4], &fps, &["--fps", "3"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(frame_numbers(&fps.join("clip")), [0, 4, 7, 10, 14, 17]);

    // Resuming: only the frame whose outputs are gone is done again.
    std::fs::remove_file(every.join("clip/000008.npz")).unwrap();
    let o = batch(&[&mp4], &every, &["--every", "4", "--skip-existing", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let done: Vec<&Value> = lines.iter().filter(|l| l["status"] == "ok").collect();
    assert_eq!(done.len(), 1, "{lines:?}");
    assert_eq!(done[0]["frame"]["index"], 8);
    assert_eq!(lines.iter().filter(|l| l["status"] == "skipped").count(), 4);
    assert_eq!(frame_numbers(&every.join("clip")), [0, 4, 8, 12, 16]);

    let o = moge().args(["batch", mp4.to_str().unwrap(), "-o", "x", "--every", "2", "--fps", "1"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot be used with"), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_video_cut_in_half_gives_its_first_frames_and_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    for (name, codec) in [("cut.webm", "vp9"), ("cut.mp4", "h264")] {
        let whole = clip(dir.path(), &format!("whole-{name}"), codec);
        let bytes = std::fs::read(&whole).unwrap();
        let cut = dir.path().join(name);
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let out = dir.path().join(format!("out-{name}"));
        let o = batch(&[&cut], &out, &[]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{stderr}");
        let got = frame_numbers(&out.join("cut"));
        assert!(!got.is_empty() && (got.len() as u64) < FRAMES, "{name}: {got:?}");
        assert_eq!(got, (0..got.len() as u64).collect::<Vec<_>>(), "{name}: the first frames, in order");
        let warning = stderr.lines().find(|l| l.starts_with("moge: warning:")).unwrap_or_else(|| panic!("{name}: no warning: {stderr}"));
        assert!(warning.contains(cut.to_str().unwrap()) && warning.contains("cut short"), "{warning}");
        assert!(warning.contains("frames read") && warning.contains("ffmpeg: "), "{warning}");
        assert!(stderr.contains(&format!("{} done, 0 failed", got.len())), "{stderr}");
        // Every frame written is whole.
        assert_eq!(files(&out, ".json").len(), got.len());
        assert!(files(&out, "").iter().all(|f| !f.contains("moge-tmp")));
    }
}

#[test]
fn a_video_among_photos_and_one_that_is_not_a_video() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = dir.path().join("in");
    std::fs::create_dir_all(inputs.join("sub")).unwrap();
    clip(&inputs.join("sub"), "drone.mp4", "h264");
    std::fs::copy(fixtures().join("images/rgb_64x48.png"), inputs.join("photo.png")).unwrap();
    // A file named like a video that is not one: it fails alone, with ffmpeg's reason.
    std::fs::write(inputs.join("notes.mp4"), b"not a video at all").unwrap();
    let out = dir.path().join("out");
    let o = batch(&[&inputs], &out, &["--every", "5"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert_eq!(frame_numbers(&out.join("sub/drone")), [0, 5, 10, 15]);
    assert!(out.join("photo.npz").exists());
    let err = stderr.lines().find(|l| l.contains("notes.mp4")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(err.contains("cannot read the video"), "{err}");
    assert!(stderr.contains("5 done, 1 failed"), "{stderr}");
}

#[test]
fn without_ffmpeg_a_video_fails_with_what_to_install_and_the_photos_are_still_done() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = dir.path().join("in");
    std::fs::create_dir_all(&inputs).unwrap();
    clip(&inputs, "clip.mp4", "h264");
    std::fs::copy(fixtures().join("images/rgb_64x48.png"), inputs.join("photo.png")).unwrap();
    let empty = dir.path().join("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let weights = fixtures().join("tiny_normal.pt");
    let o = moge()
        .args(["batch", inputs.to_str().unwrap(), "-o", dir.path().join("out").to_str().unwrap(), "--weights", weights.to_str().unwrap()])
        .args(MODEL)
        .env("PATH", &empty)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("clip.mp4")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("ffmpeg, which is not on PATH") && lines[0].contains("apt install ffmpeg"), "{}", lines[0]);
    assert!(dir.path().join("out/photo.npz").exists());
}

/// Mean absolute change of the log scale from one frame to the next.
fn flicker(scales: &[f64]) -> f64 {
    scales.windows(2).map(|w| (w[1].ln() - w[0].ln()).abs()).sum::<f64>() / (scales.len() - 1) as f64
}

#[test]
fn video_scale_smooth_follows_the_raw_scales_with_the_documented_filter() {
    let dir = tempfile::tempdir().unwrap();
    // Noise that changes every frame makes the per-frame scale flicker.
    let noisy = dir.path().join("noisy.mp4");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=96x64:rate=10:duration=2,noise=alls=60:allf=t",
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        noisy.to_str().unwrap(),
    ]);
    let (raw, smooth) = (dir.path().join("raw"), dir.path().join("smooth"));
    for (out, extra) in [(&raw, "raw"), (&smooth, "smooth=0.5")] {
        let o = batch(&[&noisy], out, &["--video-scale", extra]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let (mut raw_scales, mut smoothed, mut times) = (vec![], vec![], vec![]);
    for i in 0..FRAMES {
        let (r, s) = (sidecar(&raw.join(format!("noisy/{i:06}.json"))), sidecar(&smooth.join(format!("noisy/{i:06}.json"))));
        assert!(r["frame"].get("metric_scale_raw").is_none(), "raw runs keep the frame's own scale only");
        assert_eq!(s["frame"]["metric_scale_raw"], r["metric_scale"], "frame {i}");
        raw_scales.push(r["metric_scale"].as_f64().unwrap());
        smoothed.push(s["metric_scale"].as_f64().unwrap());
        times.push(s["frame"]["time_s"].as_f64().unwrap());
        // The maps follow the scale: depth times smoothed / raw.
        let (mut a, mut b) = (Npz::open(&raw.join(format!("noisy/{i:06}.npz"))), Npz::open(&smooth.join(format!("noisy/{i:06}.npz"))));
        let k = (smoothed[i as usize] / raw_scales[i as usize]) as f32;
        assert_eq!(b.scalar_f32("metric_scale"), smoothed[i as usize] as f32);
        for (x, y) in a.vec_f32("depth").iter().zip(b.vec_f32("depth")) {
            assert!(x.is_infinite() && y.is_infinite() || ((x * k) - y).abs() <= 1e-5 * y.abs(), "frame {i}: {x} * {k} vs {y}");
        }
    }
    // The filter as docs/usage.md states it: log s_k = log s_(k-1) + (1 - exp(-dt / T)) (log raw_k - log s_(k-1)).
    let mut state = raw_scales[0].ln();
    for i in 0..FRAMES as usize {
        if i > 0 {
            let alpha = 1.0 - (-(times[i] - times[i - 1]) / 0.5).exp();
            state += alpha * (raw_scales[i].ln() - state);
        }
        assert!((state.exp() - smoothed[i]).abs() <= 1e-5 * smoothed[i], "frame {i}: {} vs {}", state.exp(), smoothed[i]);
    }
    let (before, after) = (flicker(&raw_scales), flicker(&smoothed));
    assert!(before > 0.0 && after < before * 0.6, "frame-to-frame change of log scale: raw {before:.2e}, smooth {after:.2e}");

    // Through a server with four requests in flight, frames come back out of order: the same
    // smoothed outputs, bit for bit.
    let server = Server::start(&[]);
    let remote = dir.path().join("remote");
    let o = moge()
        .args(["batch", noisy.to_str().unwrap(), "-o", remote.to_str().unwrap(), "--server", &server.url, "--in-flight", "4"])
        .args(["--format", "npz", "--num-tokens", "300", "--video-scale", "smooth=0.5", "--jobs", "3"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for i in 0..FRAMES {
        let name = format!("noisy/{i:06}.npz");
        assert!(std::fs::read(remote.join(&name)).unwrap() == std::fs::read(smooth.join(&name)).unwrap(), "{name} differs through the server");
    }
}

#[test]
fn predict_refuses_a_video_and_batch_applies_the_size_limit_to_its_frames() {
    let dir = tempfile::tempdir().unwrap();
    let mp4 = clip(dir.path(), "clip.mp4", "h264");
    let weights = fixtures().join("tiny_normal.pt");
    let o =
        moge().args(["predict", mp4.to_str().unwrap(), "-o", dir.path().join("p").to_str().unwrap(), "--weights", weights.to_str().unwrap()]).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("clip.mp4: a video: `moge batch` reads videos frame by frame"), "{stderr}");
    // 96x64 frames against a limit of 0.005 megapixels: each frame fails, naming itself.
    let o = batch(&[&mp4], &dir.path().join("b"), &["--every", "10", "--max-megapixels", "0.005"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("clip.mp4 frame 10 (1.000 s): image is 96x64") && stderr.contains("over the limit"), "{stderr}");
    assert!(stderr.contains("0 done, 2 failed"), "{stderr}");
}

/// `ffprobe`'s count of the frames of `video`, their size and their rate.
fn probe(video: &Path) -> (u64, u64, u64, String) {
    let o = Command::new("ffprobe")
        .args(["-v", "error", "-count_frames", "-show_entries", "stream=nb_read_frames,width,height,r_frame_rate", "-of", "json"])
        .arg(video)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}: {}", video.display(), String::from_utf8_lossy(&o.stderr)));
    let s = &v["streams"][0];
    let n = |k: &str| s[k].as_u64().or_else(|| s[k].as_str().and_then(|t| t.parse().ok())).unwrap_or_else(|| panic!("{k}: {s}"));
    (n("nb_read_frames"), n("width"), n("height"), s["r_frame_rate"].as_str().unwrap().to_owned())
}

#[test]
fn format_mp4_writes_the_frames_depth_as_a_video_in_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let mp4 = clip(dir.path(), "walk.mp4", "h264");
    let out = dir.path().join("out");
    let o = batch(&[&mp4], &out, &["--every", "2", "--format", "npz,mp4"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let video = out.join("walk.depth.mp4");
    // Every other frame of a 10 fps clip: 10 frames at 5 fps, of the photo's size.
    assert_eq!(probe(&video), (FRAMES / 2, 96, 64, "5/1".to_owned()));
    assert!(files(&out, "").iter().all(|f| !f.contains("moge-tmp")));
    assert_eq!(frame_numbers(&out.join("walk")), [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]);
    // Its first and last frames are the depth of frames 0 and 18, coloured over frame 0's
    // range, within what H.264 loses.
    let first = Npz::open(&out.join("walk/000000.npz")).vec_f32("depth");
    let range = moge::outputs::vis::disparity_range(&first);
    for (n, frame) in [(0, 0), (9, 18)] {
        let png = dir.path().join(format!("mp4-{n}.png"));
        ffmpeg(&["-i", video.to_str().unwrap(), "-vf", &format!("select=eq(n\\,{n})"), "-frames:v", "1", png.to_str().unwrap()]);
        let got = image::open(&png).unwrap().to_rgb8();
        let depth = Npz::open(&out.join(format!("walk/{frame:06}.npz"))).vec_f32("depth");
        let want = moge::outputs::vis::colorize_depth_in(&depth, range);
        let diff = got.as_raw().iter().zip(&want).map(|(&a, &b)| (a as f64 - b as f64).abs()).sum::<f64>() / want.len() as f64;
        assert!(diff < 6.0, "video frame {n} differs from frame {frame}'s depth by {diff:.2} per sample");
    }

    // Resuming: the depth video there is kept; gone, it is made again with the frames done
    // before read back from their npz.
    let made = std::fs::metadata(&video).unwrap().modified().unwrap();
    std::fs::remove_file(out.join("walk/000004.npz")).unwrap();
    let o = batch(&[&mp4], &out, &["--every", "2", "--format", "npz,mp4", "--skip-existing"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stderr).contains("moge: 1 done"), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::metadata(&video).unwrap().modified().unwrap(), made);
    std::fs::remove_file(&video).unwrap();
    let o = batch(&[&mp4], &out, &["--every", "2", "--format", "npz,mp4", "--skip-existing"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stderr).contains("moge: 0 done, 0 failed, 10 skipped"), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(probe(&video), (FRAMES / 2, 96, 64, "5/1".to_owned()));

    // The video alone, of a video cut in half in a folder below: the frames it has.
    let bytes = std::fs::read(clip(dir.path(), "whole.webm", "vp9")).unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    let cut = tree.join("sub/cut.webm");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let alone = dir.path().join("alone");
    let weights = fixtures().join("tiny_normal.pt");
    let o = moge()
        .args([
            "batch",
            tree.to_str().unwrap(),
            "-o",
            alone.to_str().unwrap(),
            "--weights",
            weights.to_str().unwrap(),
            "--num-tokens",
            "300",
            "--format",
            "mp4",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let done: u64 = stderr.lines().find_map(|l| l.strip_prefix("moge: ")?.split(" done").next()?.parse().ok()).unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(files(&alone, ""), ["sub/cut.depth.mp4"]);
    assert_eq!(probe(&alone.join("sub/cut.depth.mp4")).0, done);
}

/// `--video-fov shared --shared-scale`: the first pass runs the clip's first N frames; every
/// frame then has their median field of view and metric scale, and each frame's own scale
/// stays in the sidecar.
#[test]
fn video_fov_shared_gives_every_frame_the_median_of_its_first_frames() {
    let dir = tempfile::tempdir().unwrap();
    // A moving crop of a larger picture, as a panning camera films it.
    let pan = dir.path().join("pan.mp4");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=192x128:rate=10:duration=2",
        "-vf",
        "crop=96:64:x='t*40':y='t*20'",
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        pan.to_str().unwrap(),
    ]);
    let (raw, shared) = (dir.path().join("raw"), dir.path().join("shared"));
    let o = batch(&[&pan], &raw, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = batch(&[&pan], &shared, &["--video-fov", "shared", "--shared-scale", "--camera-sample", "5"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("one camera for") && stderr.contains("the median of 5 estimates"), "{stderr}");
    let fov = |s: &Value| s["fov_x"].as_f64().unwrap();
    let raws: Vec<Value> = (0..FRAMES).map(|i| sidecar(&raw.join(format!("pan/{i:06}.json")))).collect();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let want_fov = median(raws[..5].iter().map(fov).collect());
    let want_scale = median(raws[..5].iter().map(|s| s["metric_scale"].as_f64().unwrap()).collect());
    let mut fovs = Vec::new();
    for (i, r) in raws.iter().enumerate() {
        let s = sidecar(&shared.join(format!("pan/{i:06}.json")));
        assert!((fov(&s) - want_fov).abs() < 1e-3, "frame {i}: fov {} against the median {want_fov}", fov(&s));
        assert!((s["metric_scale"].as_f64().unwrap() - want_scale).abs() < 1e-6 * want_scale, "frame {i}");
        assert_eq!(s["inference"]["fov_x_source"], "shared: the median of its folder's or video's first pass");
        assert_eq!(s["shared_camera"]["sampled"], 5);
        // The frame's own scale, as the raw run gave it (its fov given, the same forward).
        assert!((s["shared_camera"]["metric_scale_own"].as_f64().unwrap() - r["metric_scale"].as_f64().unwrap()).abs() < 1e-6, "frame {i}");
        fovs.push(fov(r));
    }
    // The raw run's field of view moves from frame to frame; the shared one does not.
    assert!(fovs.windows(2).any(|w| (w[1] - w[0]).abs() > 1e-3), "{fovs:?}");
}

/// `--video-fov smooth=T`: each frame's field of view is the running estimate of log tan(fov/2)
/// over the frames up to it, by the filter of --video-scale; the sidecar keeps its own, and
/// the scale is left alone.
#[test]
fn video_fov_smooth_follows_the_raw_fovs_with_the_documented_filter() {
    let dir = tempfile::tempdir().unwrap();
    let pan = dir.path().join("pan.mp4");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=192x128:rate=10:duration=2,noise=alls=40:allf=t",
        "-vf",
        "crop=96:64:x='t*40':y='t*20'",
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        pan.to_str().unwrap(),
    ]);
    let (raw, smooth) = (dir.path().join("raw"), dir.path().join("smooth"));
    assert!(batch(&[&pan], &raw, &[]).status.success());
    let o = batch(&[&pan], &smooth, &["--video-fov", "smooth=0.5", "--jobs", "3"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (mut own, mut got, mut times) = (vec![], vec![], vec![]);
    for i in 0..FRAMES {
        let (r, s) = (sidecar(&raw.join(format!("pan/{i:06}.json"))), sidecar(&smooth.join(format!("pan/{i:06}.json"))));
        let f = r["fov_x"].as_f64().unwrap();
        assert!((s["frame"]["fov_x_raw"].as_f64().unwrap() - f).abs() < 1e-4, "frame {i}");
        assert_eq!(s["metric_scale"], r["metric_scale"], "frame {i}: the scale is the frame's own");
        assert!(s["inference"]["fov_x_source"].as_str().unwrap().starts_with("smoothed"));
        own.push(f);
        got.push(s["fov_x"].as_f64().unwrap());
        times.push(s["frame"]["time_s"].as_f64().unwrap());
    }
    let mut state = (own[0].to_radians() / 2.0).tan().ln();
    for i in 0..own.len() {
        if i > 0 {
            let alpha = 1.0 - (-(times[i] - times[i - 1]) / 0.5).exp();
            state += alpha * ((own[i].to_radians() / 2.0).tan().ln() - state);
        }
        let want = (2.0 * state.exp().atan()).to_degrees();
        assert!((got[i] - want).abs() < 2e-3, "frame {i}: fov {} against the filter's {want}", got[i]);
    }
    let change = |v: &[f64]| v.windows(2).map(|w| (w[1] - w[0]).abs()).sum::<f64>();
    assert!(change(&own) > 0.0 && change(&got) < change(&own) * 0.8, "{} -> {}", change(&own), change(&got));
    // Not through a server: its answers are final.
    let o = moge().args(["batch", pan.to_str().unwrap(), "-o", "x", "--server", "http://127.0.0.1:9", "--video-fov", "smooth"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("a server's answer does not allow"), "{}", String::from_utf8_lossy(&o.stderr));
}
