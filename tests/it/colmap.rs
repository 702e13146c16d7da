//! `moge colmap` on a synthetic room (`tests/make_colmap_fixtures.py`): photos rendered from
//! known cameras, the reconstruction written by COLMAP itself (pycolmap) in both formats, in
//! units of 0.37 per metre, and each photo's true depth.
//!
//! - both formats read back equal, and agree with the scene they were written from;
//! - the fit, given what an ideal MoGe would give (the true metric depth, perturbed by a few %),
//!   finds the known scale within 1 % and brings the depth closer to the truth;
//! - the command, with the tiny fixture model: the images it can do written in every layout,
//!   one clear line for each it cannot (a camera with distortion, a photo missing, an image
//!   observing no point), and the same outputs from either format.

use std::path::{Path, PathBuf};

use moge::colmap::model::Format;
use moge::pipeline::post::Post;
use ndarray_npy::ReadNpyExt;
use serde_json::Value;

use crate::support::cli::run;
use crate::support::paths::fixtures;

fn dir() -> PathBuf {
    fixtures().join("colmap")
}

fn scene() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("scene.json")).unwrap()).unwrap()
}

fn truth(name: &str) -> ndarray::Array2<f32> {
    let stem = Path::new(name).with_extension("npy");
    ndarray::Array2::<f32>::read_npy(std::fs::File::open(dir().join("truth").join(stem)).unwrap()).unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn both_formats_read_back_equal_and_as_the_scene_was_written() {
    let text = moge::colmap::read(&dir().join("sparse_txt")).unwrap();
    let binary = moge::colmap::read(&dir().join("sparse_bin")).unwrap();
    assert_eq!((text.format, binary.format), (Format::Text, Format::Binary));
    assert_eq!(text.cameras, binary.cameras);
    assert_eq!(text.images, binary.images);
    assert_eq!(text.points, binary.points);
    let scene = scene();
    let scale = scene["scale"].as_f64().unwrap();
    assert_eq!(text.images.len(), 6);
    assert_eq!(text.cameras.values().map(|c| c.model.as_str()).collect::<Vec<_>>(), ["PINHOLE", "SIMPLE_PINHOLE", "OPENCV"]);
    for image in text.images.values() {
        let obs = image.observations(&text.points);
        assert_eq!(obs.len() as u64, scene["images"][&image.name]["observations"].as_u64().unwrap(), "{}", image.name);
        if obs.is_empty() {
            continue;
        }
        // Each observed point's depth (pose and point in the model's units) is the photo's true
        // depth at its pixel, in those units.
        let t = truth(&image.name);
        let rel: Vec<f64> = obs
            .iter()
            .map(|o| {
                let (x, y) = (o.pixel[0] as usize, o.pixel[1] as usize);
                (o.depth / (t[[y, x]] as f64 * scale) - 1.0).abs()
            })
            .collect();
        assert!(median(rel) < 0.05, "{}: the model's depths are not the scene's", image.name);
    }
}

/// The prediction an ideal MoGe would give of `name`: its true depth in metres, off by a few
/// per cent in a smooth pattern, with `camera` as its intrinsics.
fn ideal_prediction(name: &str, camera: &moge::camera::Pinhole) -> moge::Prediction {
    let t = truth(name);
    let (h, w) = t.dim();
    let depth: Vec<f32> = t.indexed_iter().map(|((y, x), &d)| d * (1.0 + 0.03 * ((x as f32 * 0.3).sin() + (y as f32 * 0.2).cos()) / 2.0)).collect();
    moge::Prediction {
        width: w,
        height: h,
        points: vec![0.0; 3 * w * h],
        depth,
        normal: Some([0.0, 0.0, -1.0].repeat(w * h)),
        normal_png: None,
        mask: vec![true; w * h],
        intrinsics: camera.normalised(w, h),
        metric_scale: 1.0,
        focal: 1.0,
        shift: 0.0,
        per_step: Vec::new(),
        grid: (1, 1),
    }
}

#[test]
fn the_fit_finds_the_known_scale_and_brings_the_depth_to_the_truth() {
    let model = moge::colmap::read(&dir().join("sparse_bin")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let (inputs, aligner) = moge::colmap::inputs(&model, &dir().join("images"), out.path());
    let scale = scene()["scale"].as_f64().unwrap();
    for name in ["a.png", "sub/b.png", "c.png"] {
        let input = inputs.iter().find(|i| i.path.ends_with(name)).unwrap();
        assert!(input.problem.is_none(), "{name}: {:?}", input.problem);
        let camera = input.camera.unwrap();
        let mut pred = ideal_prediction(name, &camera);
        let unaligned = pred.depth.clone();
        let done = aligner.apply(input, &mut pred, Path::new("unused")).unwrap();
        let (key, side) = done.sidecar.unwrap();
        assert_eq!(key, "colmap");
        let fit = side["fit"]["scale"].as_f64().unwrap();
        assert!((fit / scale - 1.0).abs() < 0.01, "{name}: fitted {fit}, known {scale}");
        assert!(side["fit"]["inliers"].as_u64().unwrap() >= 50, "{side}");
        // The aligned depth against the truth in the model's units, before and after.
        let t = truth(name);
        let err = |d: &[f32]| median(d.iter().zip(t.iter()).map(|(&d, &t)| (d as f64 / (t as f64 * scale) - 1.0).abs()).collect());
        let (before, after) = (err(&unaligned), err(&pred.depth));
        assert!(after < 0.02 && before > 1.0, "{name}: median relative error {before:.3} before, {after:.3} after");
        // The files: the aligned depth as float32 and as 16-bit (x1000), MoGe's inverse depth.
        let stem = Path::new(name).with_extension("");
        let npy = ndarray::Array2::<f32>::read_npy(std::fs::File::open(out.path().join("depth").join(&stem).with_extension("npy")).unwrap()).unwrap();
        assert_eq!(npy.as_slice().unwrap(), &pred.depth[..]);
        let png = image::open(out.path().join("depth").join(&stem).with_extension("png")).unwrap().into_luma16();
        let inv = image::open(out.path().join("depths").join(&stem).with_extension("png")).unwrap().into_luma16();
        let (x, y) = (20, 17);
        let d = pred.depth[y as usize * pred.width + x as usize] as f64;
        assert_eq!(png.get_pixel(x, y).0[0], (d * 1000.0).round() as u16);
        // 3DGS reads png / 65536 · scale + offset as the model's inverse depth.
        let p = side["depth_params"]["scale"].as_f64().unwrap();
        assert!(((inv.get_pixel(x, y).0[0] as f64 / 65536.0 * p) * d - 1.0).abs() < 2e-3, "{name}");
        assert!(out.path().join("normals").join(&stem).with_extension("png").is_file());
    }
    // An image that observes no point: no scale, and said so.
    let f = inputs.iter().find(|i| i.path.ends_with("f.png")).unwrap();
    let mut pred = ideal_prediction("f.png", &f.camera.unwrap());
    let e = aligner.apply(f, &mut pred, Path::new("unused")).unwrap_err().to_string();
    assert!(e.contains("image 6 ('f.png'): 0 of its 0 observed 3D points"), "{e}");
    // 3DGS's depth_params.json: the done images by name without extension.
    let params: Value = serde_json::from_slice(&std::fs::read(aligner.write_depth_params().unwrap()).unwrap()).unwrap();
    let keys: Vec<&String> = params.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["a", "c", "sub/b"]);
    assert_eq!(params["a"]["offset"], 0.0);
}

#[test]
fn the_command_writes_what_it_can_and_says_why_for_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let weights = fixtures().join("tiny_normal.pt");
    let colmap = |sparse: &str, out: &Path| {
        let args = [
            "colmap",
            dir().join(sparse).to_str().unwrap(),
            "--images",
            dir().join("images").to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--weights",
            weights.to_str().unwrap(),
            "--precision",
            "f32",
            "--num-tokens",
            "300",
        ]
        .map(str::to_owned);
        run(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let (txt, bin) = (tmp.path().join("txt"), tmp.path().join("bin"));
    let r = colmap("sparse_txt", &txt);
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{stderr}");
    for line in [
        "camera 3 is OPENCV with distortion (-0.05, 0.01, 0, 0): undistort the photos first",
        "image 5 ('e.png') of the model is not in",
        "image 6 ('f.png'): 0 of its 0 observed 3D points",
    ] {
        assert_eq!(stderr.matches(line).count(), 1, "{line}\n{stderr}");
    }
    for stem in ["a", "sub/b", "c"] {
        for f in [format!("depth/{stem}.npy"), format!("depth/{stem}.png"), format!("depths/{stem}.png"), format!("normals/{stem}.png"), format!("{stem}.json")]
        {
            assert!(txt.join(&f).is_file(), "{f}");
        }
        let side: Value = serde_json::from_slice(&std::fs::read(txt.join(format!("{stem}.json"))).unwrap()).unwrap();
        let fit = &side["colmap"]["fit"];
        assert!(fit["scale"].as_f64().unwrap() > 0.0 && fit["inliers"].as_u64().unwrap() >= 3, "{side}");
        assert!(side["colmap"]["fit_ms"].as_f64().unwrap() >= 0.0);
    }
    // The tiny model's depth, aligned: closer to the truth (in the model's units) than before.
    let scale = scene()["scale"].as_f64().unwrap();
    for (stem, name) in [("a", "a.png"), ("sub/b", "sub/b.png"), ("c", "c.png")] {
        let side: Value = serde_json::from_slice(&std::fs::read(txt.join(format!("{stem}.json"))).unwrap()).unwrap();
        let k = side["colmap"]["fit"]["scale"].as_f64().unwrap();
        let aligned = ndarray::Array2::<f32>::read_npy(std::fs::File::open(txt.join(format!("depth/{stem}.npy"))).unwrap()).unwrap();
        let t = truth(name);
        let err =
            |f: f64| median(aligned.iter().zip(t.iter()).filter(|(&d, _)| d > 0.0).map(|(&d, &t)| (d as f64 * f / (t as f64 * scale) - 1.0).abs()).collect());
        let (before, after) = (err(1.0 / k), err(1.0));
        assert!(after < before, "{stem}: median relative error {before:.3} unaligned, {after:.3} aligned");
    }
    for stem in ["d", "e", "f"] {
        assert!(!txt.join(format!("depth/{stem}.npy")).exists() && !txt.join(format!("{stem}.json")).exists(), "{stem}");
    }
    // a.png's camera is off the centre with fx != fy: used whole, its intrinsics the model's.
    let side: Value = serde_json::from_slice(&std::fs::read(txt.join("a.json")).unwrap()).unwrap();
    let k = &side["intrinsics_pixels"];
    for (got, want) in [(&k[0][0], 50.0), (&k[1][1], 53.0), (&k[0][2], 29.5), (&k[1][2], 25.25)] {
        assert!((got.as_f64().unwrap() - want).abs() < 1e-3, "{k}");
    }
    let params: Value = serde_json::from_slice(&std::fs::read(txt.join("depth_params.json")).unwrap()).unwrap();
    assert_eq!(params.as_object().unwrap().keys().collect::<Vec<_>>(), ["a", "c", "sub/b"]);

    // The binary model gives the same files.
    let r = colmap("sparse_bin", &bin);
    assert_eq!(r.status.code(), Some(1), "{}", String::from_utf8_lossy(&r.stderr));
    for f in ["depth/a.npy", "depth/sub/b.png", "depths/c.png", "normals/a.png", "depth_params.json"] {
        assert!(std::fs::read(txt.join(f)).unwrap() == std::fs::read(bin.join(f)).unwrap(), "{f} differs between the formats");
    }

    // No model in the folder: one line, naming it.
    let r =
        run(&["colmap", tmp.path().to_str().unwrap(), "--images", ".", "-o", tmp.path().join("x").to_str().unwrap(), "--weights", weights.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("no COLMAP model here"), "{}", String::from_utf8_lossy(&r.stderr));
}

/// `moge batch --format colmap` writes each photo as a COLMAP text model that reads back as
/// one (the camera = the prediction's intrinsics, every 3D point on its pixel's ray at the
/// depth of the npz); `moge colmap` over that model aligns the photo to itself: scale 1.
#[test]
fn format_colmap_writes_a_model_that_reads_back_and_aligns_to_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let photos = tmp.path().join("photos");
    std::fs::create_dir_all(&photos).unwrap();
    std::fs::copy(dir().join("images/a.png"), photos.join("a.png")).unwrap();
    let weights = fixtures().join("tiny_normal.pt");
    let out = tmp.path().join("out");
    let r = run(&[
        "batch",
        photos.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--weights",
        weights.to_str().unwrap(),
        "--precision",
        "f32",
        "--format",
        "colmap,npz,json",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let model = moge::colmap::read(&out.join("a.colmap")).unwrap();
    assert_eq!(model.format, Format::Text);
    let side: Value = serde_json::from_slice(&std::fs::read(out.join("a.json")).unwrap()).unwrap();
    let k = &side["intrinsics_pixels"];
    let cam = model.cameras[&1].pinhole().unwrap();
    assert_eq!((model.cameras[&1].width, model.cameras[&1].height), (64, 48));
    for (got, want) in [(cam.fx, &k[0][0]), (cam.fy, &k[1][1]), (cam.cx, &k[0][2]), (cam.cy, &k[1][2])] {
        assert!((got - want.as_f64().unwrap()).abs() < 1e-4, "{got} against {want}");
    }
    let image = &model.images[&1];
    assert_eq!((image.name.as_str(), image.q, image.t), ("a.png", [1.0, 0.0, 0.0, 0.0], [0.0; 3]));
    let mut npz = crate::support::npz::Npz::open(&out.join("a.npz"));
    let (depth, mask): (Vec<f32>, Vec<u8>) = (npz.vec_f32("depth"), npz.u8("mask").iter().copied().collect());
    let valid = mask.iter().filter(|&&m| m != 0).count();
    assert_eq!(model.points.len(), valid, "one point per valid pixel of a 64x48 photo");
    for (xy, id) in &image.points2d {
        let p = model.points[&id.unwrap()];
        // On the ray of its pixel, at the npz's depth there.
        let (x, y) = ((xy[0] - 0.5) as usize, (xy[1] - 0.5) as usize);
        let d = depth[y * 64 + x] as f64;
        assert!((p[2] - d).abs() < 1e-5 * d);
        assert!((cam.fx * p[0] / p[2] + cam.cx - xy[0]).abs() < 1e-3 && (cam.fy * p[1] / p[2] + cam.cy - xy[1]).abs() < 1e-3, "{xy:?}");
    }
    // The model, aligned to by the same photo: scale 1.
    let again = tmp.path().join("again");
    let r = run(&[
        "colmap",
        out.join("a.colmap").to_str().unwrap(),
        "--images",
        photos.to_str().unwrap(),
        "-o",
        again.to_str().unwrap(),
        "--weights",
        weights.to_str().unwrap(),
        "--precision",
        "f32",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let side: Value = serde_json::from_slice(&std::fs::read(again.join("a.json")).unwrap()).unwrap();
    let fit = &side["colmap"]["fit"];
    assert!((fit["scale"].as_f64().unwrap() - 1.0).abs() < 1e-4, "{fit}");
    assert_eq!(fit["inliers"], fit["points"]);
}
