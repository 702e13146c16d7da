//! `moge predict` end to end: the npz it writes holds what the library computes, in the
//! documented layout; bad inputs are reported and skipped; bad weights are fatal (exit 2).
use crate::support::cli::moge;
use crate::support::npz::Npz;
use crate::support::paths::fixtures;

#[test]
fn writes_the_npz_layout_with_library_values() {
    let dir = tempfile::tempdir().unwrap();
    let img = fixtures().join("images/rgb_64x48.png");
    let out = moge()
        .args(["predict", img.to_str().unwrap(), "--weights"])
        .arg(fixtures().join("tiny_normal.pt"))
        .args(["--num-tokens", "300", "--fov-x", "60", "--precision", "f32", "-o"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("MoGeOutput(64x48, valid "), "{stdout}");
    assert!(stdout.contains("fov_x 60.0 deg"), "{stdout}");

    let model = moge::Model::load(&fixtures().join("tiny_normal.pt"), &moge::model::BuildOptions::default()).unwrap();
    let rgb = moge::image_io::load_rgb(&img, true).unwrap();
    let opts = moge::InferOptions { num_tokens: Some(300), fov_x: Some(60.0), ..Default::default() };
    let want = model.infer(&rgb, &opts).unwrap();

    let mut z = Npz::open(&dir.path().join("rgb_64x48.npz"));
    assert_eq!(z.f32("points").shape(), &[48, 64, 3]);
    assert_eq!(z.vec_f32("points"), want.points);
    assert_eq!(z.f32("depth").shape(), &[48, 64]);
    assert_eq!(z.vec_f32("depth"), want.depth);
    assert_eq!(z.vec_f32("normal"), want.normal.clone().unwrap());
    let mask = z.u8("mask");
    assert_eq!(mask.shape(), &[48, 64]);
    assert_eq!(mask.iter().map(|&m| m == 1).collect::<Vec<_>>(), want.mask);
    assert!(mask.iter().any(|&m| m == 0) && mask.iter().any(|&m| m == 1));
    let k = z.f32("intrinsics");
    assert_eq!(k.shape(), &[3, 3]);
    assert_eq!(k[[0, 2]], 0.5);
    let kp = z.f32("intrinsics_pixels");
    assert!((kp[[0, 0]] - k[[0, 0]] * 64.0).abs() < 1e-4 && (kp[[1, 1]] - k[[1, 1]] * 48.0).abs() < 1e-4);
    assert!((kp[[0, 2]] - 32.0).abs() < 1e-6 && (kp[[1, 2]] - 24.0).abs() < 1e-6);
    assert!((z.scalar_f32("fov_x") - 60.0).abs() < 1e-3);
    let fov_y = z.scalar_f32("fov_y");
    let expect_fov_y = (2.0 * (0.5 / k[[1, 1]] as f64).atan()).to_degrees() as f32;
    assert!((fov_y - expect_fov_y).abs() < 1e-4);
    assert_eq!(z.scalar_f32("metric_scale"), want.metric_scale);
    // Invalid pixels: inf depth and points, zero normals.
    let i = want.mask.iter().position(|m| !m).unwrap();
    assert_eq!(want.depth[i], f32::INFINITY);
    assert_eq!(&want.normal.unwrap()[3 * i..3 * i + 3], &[0.0, 0.0, 0.0]);
    // No temporary files left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn a_bad_image_is_reported_and_the_rest_still_written() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("broken.jpg");
    std::fs::write(&bad, b"\xff\xd8\xff\xe0 not really a jpeg").unwrap();
    let good = fixtures().join("images/gray_50x50.png");
    let out = moge()
        .arg("predict")
        .arg(&bad)
        .arg(&good)
        .arg("--weights")
        .arg(fixtures().join("tiny_vitl.pt"))
        .args(["--num-tokens", "100", "-o"])
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("broken.jpg"), "{stderr}");
    assert!(dir.path().join("out/gray_50x50.npz").is_file());
    assert!(!dir.path().join("out/broken.npz").exists());
    // A model without a normal head writes no normal array.
    let mut z = Npz::open(&dir.path().join("out/gray_50x50.npz"));
    assert!(!z.has("normal"));
    assert!(z.has("depth"));
}

#[test]
fn weights_that_do_not_load_are_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("model.pt");
    std::fs::write(&w, b"garbage").unwrap();
    let out = moge().arg("predict").arg(fixtures().join("images/rgb_64x48.png")).arg("--weights").arg(&w).arg("-o").arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("model.pt") && stderr.contains("not a checkpoint"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one clear line: {stderr}");
}

#[test]
fn usage_errors_exit_2() {
    let out = moge().args(["predict", "x.png", "--fov-x", "200"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = moge().args(["predict", "x.png", "--precision", "f8"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn every_npz_compression_reads_back_the_same_arrays() {
    let dir = tempfile::tempdir().unwrap();
    let img = fixtures().join("images/rgb_64x48.png");
    let mut files = Vec::new();
    for (how, flag) in [
        ("none", "--npz-compression=none"),
        ("fast", "--npz-compression=fast"),
        ("small", "--npz-compression=small"),
        ("alias", "--no-compress"),
        ("default", "--npz-normal-dtype=float32"),
    ] {
        let out_dir = dir.path().join(how);
        let out = moge()
            .args(["predict", img.to_str().unwrap(), "--weights"])
            .arg(fixtures().join("tiny_normal.pt"))
            .args(["--num-tokens", "300", "--precision", "f32", flag, "-o"])
            .arg(&out_dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{how}: {}", String::from_utf8_lossy(&out.stderr));
        files.push((how, out_dir.join("rgb_64x48.npz")));
    }
    let arrays = |p: &std::path::Path| {
        let mut z = Npz::open(p);
        (z.vec_f32("points"), z.vec_f32("depth"), z.vec_f32("normal"), z.u8("mask").iter().copied().collect::<Vec<u8>>(), z.vec_f32("intrinsics"))
    };
    let want = arrays(&files[0].1);
    for (how, p) in &files[1..] {
        let got = arrays(p);
        assert!(got.0.iter().zip(&want.0).all(|(a, b)| a.to_bits() == b.to_bits()), "{how}: points differ");
        assert_eq!((&got.3, &got.4), (&want.3, &want.4), "{how}");
        assert!(got.1.iter().zip(&want.1).all(|(a, b)| a.to_bits() == b.to_bits()) && got.2 == want.2, "{how}");
    }
    // How each is stored: plain entries for none (its old spelling, and the default), deflate otherwise.
    let methods = |p: &std::path::Path| {
        let mut z = zip::ZipArchive::new(std::fs::File::open(p).unwrap()).unwrap();
        (0..z.len()).map(|i| z.by_index(i).unwrap().compression()).collect::<Vec<_>>()
    };
    for (how, p) in &files {
        let stored = matches!(*how, "none" | "alias" | "default");
        assert!(methods(p).iter().all(|m| (*m == zip::CompressionMethod::Stored) == stored), "{how}: {:?}", methods(p));
    }
    let size = |i: usize| std::fs::metadata(&files[i].1).unwrap().len();
    assert!(size(0) > size(1) && size(1) >= size(2), "none {} fast {} small {}", size(0), size(1), size(2));
    assert_eq!(std::fs::read(&files[0].1).unwrap(), std::fs::read(&files[3].1).unwrap());
    assert_eq!(std::fs::read(&files[0].1).unwrap(), std::fs::read(&files[4].1).unwrap(), "the default is not none");
}
