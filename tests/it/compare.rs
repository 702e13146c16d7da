//! `moge compare`: a prediction changed by known amounts (depth and points 2 % further, pixels
//! dropped from the mask, another focal length) gives exactly those figures, and the gates
//! pass or fail on them; two output directories are paired by path, and photos on one side
//! only are named; unreadable inputs are exit 2 with the file named.

use std::path::Path;
use std::process::Output;

use moge::outputs::npz::{Compression, NormalDtype};
use serde_json::Value;

use crate::support::cli::run;
use crate::support::paths::fixtures;

fn predict(photos: &Path, out: &Path) {
    let weights = fixtures().join("tiny_normal.pt");
    let o = run(&["batch", photos.to_str().unwrap(), "-o", out.to_str().unwrap(), "--weights", weights.to_str().unwrap(), "--precision", "f32", "-q"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn compare(args: &[&str]) -> (Output, Value) {
    let o = run(&[&["compare", "--json"], args].concat());
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o, v)
}

#[test]
fn known_changes_give_their_figures_and_gates_decide_the_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let photos = dir.path().join("photos");
    std::fs::create_dir(&photos).unwrap();
    std::fs::copy(fixtures().join("images/rgb_64x48.png"), photos.join("p.png")).unwrap();
    let out = dir.path().join("out");
    predict(&photos, &out);
    let a_path = out.join("p.npz");
    let a = moge::remote::read_prediction(&std::fs::read(&a_path).unwrap()).unwrap();
    let mut b = a.clone();
    b.depth.iter_mut().for_each(|d| *d *= 1.02);
    b.points.iter_mut().for_each(|p| *p *= 1.02);
    b.metric_scale *= 1.02;
    let valid: Vec<usize> = (0..a.mask.len()).filter(|&i| a.mask[i]).collect();
    for &i in valid.iter().take(10) {
        b.mask[i] = false;
        b.depth[i] = f32::INFINITY;
        b.points[3 * i..3 * i + 3].fill(f32::INFINITY);
    }
    b.intrinsics[0][0] *= 1.1;
    let b_path = dir.path().join("b.npz");
    moge::outputs::npz::write(&b_path, &b, Compression::None, NormalDtype::Float32).unwrap();

    let (o, v) = compare(&[a_path.to_str().unwrap(), b_path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "no gates: {}", String::from_utf8_lossy(&o.stderr));
    let f = &v["photos"][0];
    assert_eq!(f["name"], "b.npz");
    let num = |k: &str| f[k].as_f64().unwrap_or_else(|| panic!("{k}: {f}"));
    assert!((num("depth_rel_median") - 0.02).abs() < 1e-5 && (num("depth_rel_max") - 0.02).abs() < 1e-5, "{f}");
    assert!(num("depth_pcc") > 0.999_999 && num("points_pcc") > 0.999_999 && num("normal_pcc") > 0.999_999, "{f}");
    assert_eq!(f["both_valid"].as_u64().unwrap() as usize, valid.len() - 10);
    assert!((num("mask_iou") - (valid.len() - 10) as f64 / valid.len() as f64).abs() < 1e-12, "{f}");
    let fov = |k: f32| (2.0 * (0.5 / k as f64).atan()).to_degrees();
    assert!((num("fov_x_diff") - (fov(a.intrinsics[0][0]) - fov(b.intrinsics[0][0])).abs()).abs() < 1e-3, "{f}");
    assert!(num("fov_y_diff") < 1e-6 && (num("scale_ratio") - 1.02).abs() < 1e-5, "{f}");

    // Gates: within them, exit 0; past one, exit 1 and the gate named.
    let (o, v) = compare(&[a_path.to_str().unwrap(), b_path.to_str().unwrap(), "--max-depth-rel-median", "0.03", "--min-pcc", "0.999"]);
    assert_eq!((o.status.code(), v["passed"].as_bool()), (Some(0), Some(true)));
    let (o, v) = compare(&[a_path.to_str().unwrap(), b_path.to_str().unwrap(), "--max-depth-rel-median", "0.01", "--max-scale-diff", "0.05"]);
    assert_eq!((o.status.code(), v["passed"].as_bool()), (Some(1), Some(false)));
    let failed: Vec<&str> = v["photos"][0]["failed"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].starts_with("median relative depth error 0.02"), "{failed:?}");
    // The table names it on stderr.
    let o = run(&["compare", a_path.to_str().unwrap(), b_path.to_str().unwrap(), "--min-mask-iou", "0.9999"]);
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("moge: b.npz: mask IoU"), "{stderr}");
    assert!(String::from_utf8_lossy(&o.stdout).lines().next().unwrap().starts_with("photo"));
}

#[test]
fn directories_are_paired_by_path_and_strays_named() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    predict(&fixtures().join("images"), &a);
    predict(&fixtures().join("images"), &b);
    // Every npz of the tree (the fixtures' images have subfolders).
    let n = walkdir::WalkDir::new(&a).into_iter().filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "npz")).count();
    // The same run twice: the same numbers, bit for bit.
    let strict = ["--min-pcc", "0.999999999", "--max-depth-rel", "0", "--min-mask-iou", "1", "--max-fov-diff", "0", "--max-scale-diff", "0"];
    let (o, v) = compare(&[&[a.to_str().unwrap(), b.to_str().unwrap()], &strict[..]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(v["photos"].as_array().unwrap().len(), n);
    assert_eq!(v["worst"]["depth_rel_max"], 0.0);
    std::fs::remove_file(b.join("rgb_40x72.npz")).unwrap();
    let (o, v) = compare(&[a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(v["only_in_a"], serde_json::json!(["rgb_40x72.npz"]));
    assert_eq!(v["photos"].as_array().unwrap().len(), n - 1);
}

#[test]
fn unreadable_inputs_are_exit_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.npz");
    std::fs::write(&bad, b"not a zip").unwrap();
    let o = run(&["compare", bad.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad.npz"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["compare", bad.to_str().unwrap(), dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not one of each"));
}
