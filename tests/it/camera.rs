//! A known camera used whole (`--intrinsics`, `--intrinsics-from`): fx != fy and an off-centre
//! principal point brought to the view the model takes, and the outputs back in the photo's
//! camera.
//!
//! The geometry is held on a plane: the network's raw output is replaced by the point map that a
//! tilted plane gives in the view (what a model that predicts that plane would output), and the
//! post-processing run as the pipeline runs it (prepare, finish). The depth it gives at each of
//! the photo's pixels must be the plane's along that pixel's ray through the given camera.

use std::path::Path;

use moge::camera::Pinhole;
use moge::model::{BuildOptions, RawOutput};
use moge::pipeline::plan::{self, Plan};
use serde_json::Value;

use crate::support::cli::run;
use crate::support::paths::fixtures;

/// The plane n·P = D, n = (0.25, -0.15, 1) (not normalised).
const N: [f64; 3] = [0.25, -0.15, 1.0];
const D: f64 = 3.0;

/// The depth of the plane along the ray (a, b, 1).
fn plane_depth(a: f64, b: f64) -> f64 {
    D / (N[0] * a + N[1] * b + N[2])
}

fn model() -> moge::Model {
    moge::Model::load(&fixtures().join("tiny_normal.pt"), &BuildOptions::default()).unwrap()
}

/// The plan of a photo with `camera` known, as the pipeline makes it.
fn plan_of(camera: &Pinhole, w: u32, h: u32) -> Plan {
    let known = moge::image_io::FovFrom::Intrinsics(*camera).of_matrix(w, h).unwrap();
    Plan::default().with_known_fov(Some(&known)).into_owned()
}

/// The prediction for a `w` x `h` photo under `plan`, the network's output replaced by the
/// plane as seen in the image the network runs on (whose camera is square and centred, with
/// the field of view `plan` gives it).
fn predict_plane(model: &moge::Model, w: u32, h: u32, plan: &Plan) -> moge::Prediction {
    let photo = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 3) as u8, (y * 5) as u8, 90]));
    let placed = plan::prepare(model, &photo, plan).unwrap();
    let (vw, vh) = (placed.prep.width as f64, placed.prep.height as f64);
    let fov = placed.opts.fov_x.expect("a camera gives the view's field of view") as f64;
    let focal = vw / 2.0 / (fov.to_radians() / 2.0).tan();
    let (rows, cols) = placed.prep.grid;
    let (rh, rw) = (16 * rows, 16 * cols);
    let mut points = vec![0f32; 3 * rh * rw];
    for i in 0..rh {
        for j in 0..rw {
            // The raw map's pixel centres spread over the view (align_corners=False).
            let a = ((j as f64 + 0.5) / rw as f64 * vw - vw / 2.0) / focal;
            let b = ((i as f64 + 0.5) / rh as f64 * vh - vh / 2.0) / focal;
            let o = i * rw + j;
            // remap 'exp': x/z, y/z, log z.
            points[o] = a as f32;
            points[rh * rw + o] = b as f32;
            points[2 * rh * rw + o] = plane_depth(a, b).ln() as f32;
        }
    }
    let raw = RawOutput { size: (rh, rw), points, metric_scale: Some(0.0), grid: placed.prep.grid, ..RawOutput::default() };
    plan::finish(model, &placed, &raw, plan)
}

/// The largest relative error of the depth against the plane's along the rays of `camera`.
fn depth_error(p: &moge::Prediction, camera: &Pinhole) -> f64 {
    let mut worst = 0f64;
    for y in 0..p.height {
        for x in 0..p.width {
            let a = (x as f64 + 0.5 - camera.cx) / camera.fx;
            let b = (y as f64 + 0.5 - camera.cy) / camera.fy;
            let want = plane_depth(a, b);
            let got = p.depth[y * p.width + x] as f64;
            assert!(got.is_finite(), "pixel ({x}, {y}) has no depth");
            worst = worst.max((got - want).abs() / want);
        }
    }
    worst
}

#[test]
fn an_off_centre_camera_with_unsquare_pixels_recovers_the_plane_in_its_own_camera() {
    let model = model();
    let (w, h) = (96u32, 64u32);
    for camera in [
        Pinhole::new([80.0, 80.0, 30.25, 40.5]).unwrap(),  // off the centre, resampled by a quarter pixel
        Pinhole::new([80.0, 80.0, 36.0, 22.0]).unwrap(),   // off the centre by whole pixels: a copy
        Pinhole::new([70.0, 91.0, 60.7, 29.3]).unwrap(),   // fx != fy as well
        Pinhole::new([100.0, 100.0, 48.0, 32.0]).unwrap(), // the model's own camera
    ] {
        let plan = plan_of(&camera, w, h);
        let p = predict_plane(&model, w, h, &plan);
        assert_eq!((p.width, p.height), (w as usize, h as usize));
        let err = depth_error(&p, &camera);
        assert!(err < 1e-4, "{camera}: depth off the plane by {err:.2e}");
        // The npz's intrinsics are the given camera's (the model's own to float precision).
        let k = camera.normalised(w as usize, h as usize);
        for (r, row) in p.intrinsics.iter().enumerate() {
            for (c, v) in row.iter().enumerate() {
                assert!((v - k[r][c]).abs() < 1e-5, "{camera}: intrinsics[{r}][{c}] {v} against {}", k[r][c]);
            }
        }
        // points = depth · K⁻¹ [u, v, 1] in the photo's camera.
        let i = (h as usize / 3) * w as usize + w as usize / 4;
        let (u, v, d) = ((w / 4) as f64 + 0.5, (h / 3) as f64 + 0.5, p.depth[i] as f64);
        assert!((p.points[3 * i] as f64 - (u - camera.cx) / camera.fx * d).abs() < 1e-4 * d, "{camera}");
        assert!((p.points[3 * i + 1] as f64 - (v - camera.cy) / camera.fy * d).abs() < 1e-4 * d, "{camera}");

        // What a camera used by its fx alone gives (the photo run as it is with that field of
        // view, as before): the same plane, off by far more wherever the camera is not centred.
        if !camera.is_centred(w, h) {
            let fx_only = Plan { camera: None, ..plan.clone() };
            let e = depth_error(&predict_plane(&model, w, h, &fx_only), &camera);
            assert!(e > 20.0 * err.max(1e-4), "{camera}: by fx alone the depth is off by {e:.2e}, used whole by {err:.2e}");
        }
    }
}

/// `--fit pad` grows the view to the canvas aspect around the principal point; `stretch` is
/// refused with the reason.
#[test]
fn a_camera_with_fit_pad_keeps_the_plane_and_stretch_is_refused() {
    let model = model();
    let camera = Pinhole::new([70.0, 91.0, 60.7, 29.3]).unwrap();
    let mut plan = plan_of(&camera, 96, 64);
    plan.fit = moge::fit::FitMode::Pad;
    plan.canvas = moge::fit::Canvas { width: 160, height: 90 };
    let p = predict_plane(&model, 96, 64, &plan);
    let err = depth_error(&p, &camera);
    assert!(err < 1e-4, "depth off the plane by {err:.2e}");
    plan.fit = moge::fit::FitMode::Stretch;
    let photo = image::RgbImage::new(96, 64);
    let e = plan::prepare(&model, &photo, &plan).unwrap_err().to_string();
    assert!(e.contains("--fit stretch would make a known camera's pixels unsquare"), "{e}");
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn npz_intrinsics(path: &Path) -> Vec<f32> {
    use ndarray_npy::NpzReader;
    let mut npz = NpzReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let k: ndarray::Array2<f32> = npz.by_name("intrinsics").or_else(|_| npz.by_name("intrinsics.npy")).unwrap();
    k.iter().copied().collect()
}

/// Through the command line: a centred square-pixel matrix gives today's `--fov-x` bit for bit;
/// an off-centre one its own intrinsics in the npz; a table gives each photo its row, and a
/// photo without one fails alone.
#[test]
fn the_command_line_uses_the_matrix_whole_and_a_table_per_photo() {
    let dir = tempfile::tempdir().unwrap();
    let photos = dir.path().join("photos");
    std::fs::create_dir_all(photos.join("sub")).unwrap();
    for name in ["a.png", "b.png", "sub/c.png"] {
        std::fs::copy(fixtures().join("images/rgb_64x48.png"), photos.join(name)).unwrap();
    }
    let weights = fixtures().join("tiny_normal.pt");
    let batch = |out: &Path, extra: &[&str]| {
        let args = [
            &[
                "batch",
                photos.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
                "--weights",
                weights.to_str().unwrap(),
                "--precision",
                "f32",
                "--format",
                "npz,json",
            ],
            extra,
        ]
        .concat();
        run(&args)
    };

    // Centred, square: the field of view alone, as --fov-x gives it.
    let k = Pinhole::new([50.0, 50.0, 32.0, 24.0]).unwrap();
    let fov = k.fov_x(64) as f32;
    let (by_k, by_fov) = (dir.path().join("k"), dir.path().join("fov"));
    assert!(batch(&by_k, &["--intrinsics", "50,50,32,24"]).status.success());
    assert!(batch(&by_fov, &["--fov-x", &fov.to_string()]).status.success());
    for name in ["a", "b", "sub/c"] {
        let f = format!("{name}.npz");
        assert!(std::fs::read(by_k.join(&f)).unwrap() == std::fs::read(by_fov.join(&f)).unwrap(), "{f} differs from --fov-x {fov}");
    }
    assert_eq!(json(&by_k.join("a.json"))["inference"]["fov_x_source"], "intrinsics fx 50 fy 50 cx 32 cy 24");

    // Off the centre, fx != fy: the npz's intrinsics are the given matrix, normalised.
    let off = dir.path().join("off");
    let r = batch(&off, &["--intrinsics", "48,52,20.5,30"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let got = npz_intrinsics(&off.join("a.npz"));
    let want = [48.0 / 64.0, 0.0, 20.5 / 64.0, 0.0, 52.0 / 48.0, 30.0 / 48.0, 0.0, 0.0, 1.0];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?} against {want:?}");
    }
    let side = json(&off.join("a.json"));
    assert!((side["fov_x"].as_f64().unwrap() - Pinhole::new([48.0, 52.0, 20.5, 30.0]).unwrap().fov_x(64)).abs() < 1e-3, "{side}");

    // Through a server: the view goes, and comes back to the photo here, the same.
    let server = crate::support::serve::Server::start(&[]);
    let remote = dir.path().join("remote");
    let r = run(&[
        "batch",
        photos.to_str().unwrap(),
        "-o",
        remote.to_str().unwrap(),
        "--server",
        &server.url,
        "--format",
        "npz,json",
        "--intrinsics",
        "48,52,20.5,30",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(std::fs::read(remote.join("a.npz")).unwrap() == std::fs::read(off.join("a.npz")).unwrap(), "through a server");

    // A table: a.png and sub/c.png have rows (CSV, by file name and by path), b.png none.
    let table = dir.path().join("cameras.csv");
    std::fs::write(&table, "name,fx,fy,cx,cy\na.png,48,52,20.5,30\nsub/c.png,50,50,32,24\n").unwrap();
    let by_table = dir.path().join("table");
    let r = batch(&by_table, &["--intrinsics-from", table.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("b.png") && stderr.contains("no camera for it in") && stderr.contains("cameras.csv"), "{stderr}");
    assert!(!by_table.join("b.npz").exists());
    assert!(std::fs::read(by_table.join("a.npz")).unwrap() == std::fs::read(off.join("a.npz")).unwrap(), "a table's row is --intrinsics");
    assert!(std::fs::read(by_table.join("sub/c.npz")).unwrap() == std::fs::read(by_k.join("sub/c.npz")).unwrap());

    // A bad table stops the run before it starts, and says where.
    std::fs::write(&table, "a.png,48,52,20.5\n").unwrap();
    let r = batch(&dir.path().join("bad"), &["--intrinsics-from", table.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("line 1: 4 columns"), "{}", String::from_utf8_lossy(&r.stderr));
    // A principal point outside the photo fails that photo with the reason.
    let r = batch(&dir.path().join("outside"), &["--intrinsics", "50,50,80,24"]);
    assert_eq!(r.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&r.stderr).contains("lies outside the 64x48 photo"), "{}", String::from_utf8_lossy(&r.stderr));
}

/// `--camera shared`: each folder's photos get the median field of view of a first pass over
/// a sample spread over the folder (here all of them), and with --shared-scale its scale too.
#[test]
fn camera_shared_gives_each_folder_the_median_of_its_photos() {
    let dir = tempfile::tempdir().unwrap();
    let photos = dir.path().join("photos");
    for (folder, names) in [("one", &["rgb_64x48.png", "rgb_40x72.png", "gray_50x50.png"][..]), ("two", &["rgba_45x30.png", "rgb_64x48.png"][..])] {
        std::fs::create_dir_all(photos.join(folder)).unwrap();
        for n in names {
            std::fs::copy(fixtures().join("images").join(n), photos.join(folder).join(n)).unwrap();
        }
    }
    let weights = fixtures().join("tiny_normal.pt");
    let batch = |out: &Path, extra: &[&str]| {
        run(&[
            &["batch", photos.to_str().unwrap(), "-o", out.to_str().unwrap(), "--weights", weights.to_str().unwrap(), "--precision", "f32", "--format", "json"],
            extra,
        ]
        .concat())
    };
    let (own, shared) = (dir.path().join("own"), dir.path().join("shared"));
    assert!(batch(&own, &[]).status.success());
    let r = batch(&shared, &["--camera", "shared", "--shared-scale"]);
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{stderr}");
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    for (folder, names) in [("one", vec!["rgb_64x48", "rgb_40x72", "gray_50x50"]), ("two", vec!["rgba_45x30", "rgb_64x48"])] {
        let side = |root: &Path, n: &str| json(&root.join(folder).join(format!("{n}.json")));
        let want_fov = median(names.iter().map(|n| side(&own, n)["fov_x"].as_f64().unwrap()).collect());
        let want_scale = median(names.iter().map(|n| side(&own, n)["metric_scale"].as_f64().unwrap()).collect());
        assert!(stderr.contains(&format!("one camera for {}", photos.join(folder).display())), "{stderr}");
        for n in &names {
            let s = side(&shared, n);
            assert!((s["fov_x"].as_f64().unwrap() - want_fov).abs() < 1e-3, "{folder}/{n}: {} against {want_fov}", s["fov_x"]);
            assert!((s["metric_scale"].as_f64().unwrap() / want_scale - 1.0).abs() < 1e-5, "{folder}/{n}");
            assert_eq!(s["shared_camera"]["sampled"].as_u64(), Some(names.len() as u64));
        }
    }
    // Not with a given field of view.
    let r = batch(&dir.path().join("x"), &["--camera", "shared", "--fov-x", "60"]);
    assert_eq!(r.status.code(), Some(2));
}
