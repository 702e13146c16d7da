//! `moge::remote`: the npz read back, from this crate's encoder and from numpy.

use std::io::{Cursor, Write};

use moge::outputs::npz::{encode, Compression, NormalDtype};
use moge::remote::read_prediction;
use moge::Prediction;

// ---------------------------------------------------------------------------------------------
// Predictions

/// A prediction whose every field differs per pixel, with invalid pixels (inf depth and
/// points, zero normal) and intrinsics of a known focal.
fn synthetic(height: usize, width: usize, with_normal: bool) -> Prediction {
    let n = height * width;
    let mut points = Vec::with_capacity(3 * n);
    let mut depth = Vec::with_capacity(n);
    let mut normal = Vec::with_capacity(3 * n);
    let mut mask = Vec::with_capacity(n);
    for i in 0..n {
        let (y, x) = ((i / width) as f32, (i % width) as f32);
        let valid = i % 7 != 3;
        let z = 0.5 + 0.0137 * x + 0.291 * y + (i as f32).sin() * 0.01;
        if valid {
            depth.push(z);
            points.extend([(x - 3.3) * z * 0.11, (y - 2.7) * z * 0.13, z]);
            let (a, b) = (0.3 * (x * 0.7).sin(), 0.2 * (y * 1.3).cos());
            let l = (a * a + b * b + 1.0).sqrt();
            normal.extend([a / l, b / l, -1.0 / l]);
        } else {
            depth.push(f32::INFINITY);
            points.extend([f32::INFINITY; 3]);
            normal.extend([0.0; 3]);
        }
        mask.push(valid);
    }
    let focal = 1.37f32;
    let aspect = width as f64 / height as f64;
    let diag = (1.0 + aspect * aspect).sqrt();
    let (fx, fy) = (focal / 2.0 * diag as f32 / aspect as f32, focal / 2.0 * diag as f32);
    Prediction {
        width,
        height,
        points,
        depth,
        normal: with_normal.then_some(normal),
        mask,
        intrinsics: [[fx, 0.0, 0.5], [0.0, fy, 0.5], [0.0, 0.0, 1.0]],
        metric_scale: 3.75,
        focal,
        shift: 0.25,
        grid: (4, 6),
    }
}

fn npz_of(p: &Prediction, compression: Compression, dtype: NormalDtype) -> Vec<u8> {
    encode(Cursor::new(Vec::new()), p, compression, dtype).unwrap().into_inner()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Everything the npz holds equal (bit for bit), normals within `normal_tol`.
fn assert_same(got: &Prediction, want: &Prediction, normal_tol: f32) {
    assert_eq!((got.height, got.width), (want.height, want.width));
    assert_eq!(bits(&got.points), bits(&want.points), "points");
    assert_eq!(bits(&got.depth), bits(&want.depth), "depth");
    assert_eq!(got.mask, want.mask, "mask");
    assert_eq!(got.intrinsics, want.intrinsics, "intrinsics");
    assert_eq!(got.metric_scale.to_bits(), want.metric_scale.to_bits(), "metric_scale");
    match (&got.normal, &want.normal) {
        (None, None) => {}
        (Some(g), Some(w)) => {
            assert_eq!(g.len(), w.len());
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                assert!((a - b).abs() <= normal_tol, "normal[{i}]: {a} vs {b}");
            }
        }
        (g, w) => panic!("normal present: got {}, want {}", g.is_some(), w.is_some()),
    }
}

#[test]
fn npz_read_back_equals_what_was_encoded() {
    for with_normal in [true, false] {
        let p = synthetic(6, 9, with_normal);
        for compression in [Compression::None, Compression::Fast] {
            for dtype in [NormalDtype::Float32, NormalDtype::Float16] {
                let got = read_prediction(&npz_of(&p, compression, dtype)).unwrap();
                // float16 has 11 significant bits: 2^-11 relative on values up to 1.
                let tol = if dtype == NormalDtype::Float16 { 1.0 / 2048.0 } else { 0.0 };
                assert_same(&got, &p, tol);
                assert!(got.depth.iter().filter(|d| d.is_infinite()).count() > 0);
                // Not in the npz: the focal follows from the intrinsics, the rest is "unknown".
                assert!((got.focal - p.focal).abs() < 1e-6, "focal {} vs {}", got.focal, p.focal);
                assert_eq!((got.shift, got.grid), (0.0, (0, 0)));
                if dtype == NormalDtype::Float16 && with_normal {
                    let n = got.normal.as_ref().unwrap();
                    assert!(n.iter().zip(p.normal.as_ref().unwrap()).any(|(a, b)| a != b), "f16 read as if exact");
                }
            }
        }
    }
}

#[test]
fn npz_as_numpy_writes_it() {
    // tests/make_remote_npz.py: np.savez_compressed, bool mask, float16 normal, float64
    // intrinsics and metric_scale; pixel (1, 2) invalid.
    let bytes = std::fs::read("tests/fixtures/remote/numpy_prediction.npz").unwrap();
    let p = read_prediction(&bytes).unwrap();
    assert_eq!((p.height, p.width), (4, 5));
    assert_eq!(p.metric_scale, 2.5);
    assert_eq!(p.intrinsics, [[0.8, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]]);
    let normal = p.normal.as_ref().expect("normal");
    for y in 0..4 {
        for x in 0..5 {
            let i = y * 5 + x;
            let (xf, yf) = (x as f32, y as f32);
            if (y, x) == (1, 2) {
                assert!(!p.mask[i] && p.depth[i] == f32::INFINITY && p.points[3 * i..3 * i + 3] == [f32::INFINITY; 3]);
                assert_eq!(normal[3 * i..3 * i + 3], [0.0; 3]);
                continue;
            }
            let d = 1.0 + 0.25 * xf + 0.5 * yf;
            assert!(p.mask[i]);
            assert_eq!(p.depth[i], d);
            assert_eq!(p.points[3 * i..3 * i + 3], [(xf - 2.0) * 0.125 * d, (yf - 1.5) * 0.125 * d, d]);
            let v = [xf / 8.0 - 0.25, yf / 8.0 - 0.25, -1.0];
            let l = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
            for c in 0..3 {
                assert!((normal[3 * i + c] - v[c] / l).abs() < 1e-3, "normal ({y}, {x}, {c})");
            }
        }
    }
}

/// An npz of the given (name, .npy bytes) entries.
fn zip_of(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (name, data) in entries {
        zip.start_file(format!("{name}.npy"), zip::write::SimpleFileOptions::default()).unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn npy<T: ndarray_npy::WritableElement, D: ndarray::Dimension>(a: ndarray::Array<T, D>) -> Vec<u8> {
    use ndarray_npy::WriteNpyExt;
    let mut out = Vec::new();
    a.write_npy(&mut out).unwrap();
    out
}

/// The entries of a whole 2x3 prediction, to spoil one at a time.
fn entries() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("points", npy(ndarray::Array3::<f32>::zeros((2, 3, 3)))),
        ("depth", npy(ndarray::Array2::<f32>::ones((2, 3)))),
        ("mask", npy(ndarray::Array2::<u8>::ones((2, 3)))),
        ("intrinsics", npy(ndarray::Array2::<f32>::eye(3))),
        ("metric_scale", npy(ndarray::arr0(1f32))),
    ]
}

#[test]
fn npz_errors_name_the_array_and_the_reason() {
    let err = |entries: Vec<(&str, Vec<u8>)>| format!("{:#}", read_prediction(&zip_of(&entries)).unwrap_err());
    assert!(read_prediction(&zip_of(&entries())).is_ok());
    let without = |name: &str| entries().into_iter().filter(|(n, _)| *n != name).collect::<Vec<_>>();
    let replaced = |name: &str, data: Vec<u8>| entries().into_iter().map(|(n, d)| if n == name { (n, data.clone()) } else { (n, d) }).collect::<Vec<_>>();

    for name in ["points", "depth", "mask", "intrinsics", "metric_scale"] {
        let e = err(without(name));
        assert!(e.contains(&format!("no `{name}` array")), "{e}");
    }
    let e = err(replaced("points", npy(ndarray::Array3::<f32>::zeros((2, 3, 4)))));
    assert!(e.contains("points.npy has shape [2, 3, 4], expected [2, 3, 3]"), "{e}");
    let e = err(replaced("depth", npy(ndarray::Array3::<f32>::zeros((2, 3, 1)))));
    assert!(e.contains("depth.npy has shape"), "{e}");
    let e = err(replaced("mask", npy(ndarray::Array2::<f32>::ones((2, 3)))));
    assert!(e.contains("mask.npy has element type <f4"), "{e}");
    let e = err(replaced("depth", npy(ndarray::Array2::<i32>::ones((2, 3)))));
    assert!(e.contains("depth.npy has element type <i4"), "{e}");
    let e = err(replaced("metric_scale", npy(ndarray::arr1(&[1f32, 2.0]))));
    assert!(e.contains("metric_scale.npy has shape [2], expected a scalar"), "{e}");
    // A header that claims more data than the entry holds: refused before allocating.
    let mut lying = npy(ndarray::Array2::<f32>::ones((2, 3)));
    let at = lying.windows(6).position(|w| w == b"(2, 3)").unwrap();
    lying[at..at + 6].copy_from_slice(b"(2,99)");
    let e = err(replaced("depth", lying));
    assert!(e.contains("depth.npy is damaged"), "{e}");
    // The data cut short.
    let mut short = npy(ndarray::Array2::<f32>::ones((2, 3)));
    short.truncate(short.len() - 4);
    let e = err(replaced("depth", short));
    assert!(e.contains("cannot read depth.npy: reached EOF"), "{e}");
    // Not a zip, a zip cut short, an entry that is not .npy.
    for (bytes, want) in [
        (b"not a zip file at all".to_vec(), "not a valid npz"),
        (zip_of(&entries())[..200].to_vec(), "not a valid npz"),
        (zip_of(&replaced("depth", b"garbage".to_vec())), "depth.npy is not a valid .npy"),
    ] {
        let e = format!("{:#}", read_prediction(&bytes).unwrap_err());
        assert!(e.contains(want), "{e}");
    }
    // A deflated entry whose data was damaged: the checksum catches it.
    let mut bytes = npz_of(&synthetic(6, 9, true), Compression::Fast, NormalDtype::Float32);
    let mid = bytes.len() / 3;
    for b in &mut bytes[mid..mid + 16] {
        *b ^= 0x5a;
    }
    assert!(read_prediction(&bytes).is_err());
}
