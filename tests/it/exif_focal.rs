//! `--fov-x exif`: JPEGs written with the focal-length tags a camera writes (35 mm equivalent;
//! physical with the focal plane's resolution; rotated by the Orientation tag and not), through
//! `moge batch` here and through `moge serve`: the field of view used is the tags', and a photo
//! without them falls back to the model's estimate, each sidecar saying which.

use std::path::Path;

use serde_json::Value;

use crate::support::cli::run;
use crate::support::paths::fixtures;
use crate::support::serve::Server;

/// An EXIF tag and its value, as the writer below lays it out.
pub(crate) enum V {
    Short(u16),
    Long(u32),
    Rational(u32, u32),
}

/// The APP1 payload ("Exif\0\0" and a little-endian TIFF) of IFD0 `ifd0` and an Exif IFD
/// `exif`, each a list of (tag, value) in increasing tag order.
pub(crate) fn exif_block(ifd0: &[(u16, V)], exif: &[(u16, V)]) -> Vec<u8> {
    // IFD0 gets one more entry: the Exif IFD's offset.
    let ifd_len = |n: usize| 2 + 12 * n + 4;
    let ifd0_at = 8;
    let exif_at = ifd0_at + ifd_len(ifd0.len() + 1);
    let data_at = exif_at + ifd_len(exif.len());
    let mut tiff = b"II\x2a\x00".to_vec();
    tiff.extend(8u32.to_le_bytes());
    let mut data: Vec<u8> = Vec::new();
    let mut write_ifd = |tiff: &mut Vec<u8>, entries: &[(u16, V)], next_exif: Option<u32>| {
        let mut all: Vec<(u16, u16, u32, [u8; 4])> = Vec::new();
        for (tag, v) in entries {
            let (kind, value) = match v {
                V::Short(s) => (3u16, {
                    let mut b = [0u8; 4];
                    b[..2].copy_from_slice(&s.to_le_bytes());
                    b
                }),
                V::Long(l) => (4u16, l.to_le_bytes()),
                V::Rational(n, d) => {
                    let at = (data_at + data.len()) as u32;
                    data.extend(n.to_le_bytes());
                    data.extend(d.to_le_bytes());
                    (5u16, at.to_le_bytes())
                }
            };
            all.push((*tag, kind, 1, value));
        }
        if let Some(at) = next_exif {
            all.push((0x8769, 4, 1, at.to_le_bytes()));
        }
        all.sort_by_key(|e| e.0);
        tiff.extend((all.len() as u16).to_le_bytes());
        for (tag, kind, count, value) in all {
            tiff.extend(tag.to_le_bytes());
            tiff.extend(kind.to_le_bytes());
            tiff.extend(count.to_le_bytes());
            tiff.extend(value);
        }
        tiff.extend(0u32.to_le_bytes());
    };
    write_ifd(&mut tiff, ifd0, Some(exif_at as u32));
    write_ifd(&mut tiff, exif, None);
    assert_eq!(tiff.len(), data_at);
    tiff.extend(data);
    let mut block = b"Exif\0\0".to_vec();
    block.extend(tiff);
    block
}

/// A JPEG of `w` x `h` with `exif` as its APP1 segment, right after SOI.
fn jpeg_with_exif(w: u32, h: u32, exif: Option<Vec<u8>>) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, ((x * 3 + y * 5) % 256) as u8]));
    let mut jpeg = std::io::Cursor::new(Vec::new());
    img.write_to(&mut jpeg, image::ImageFormat::Jpeg).unwrap();
    let jpeg = jpeg.into_inner();
    let Some(exif) = exif else { return jpeg };
    let mut out = jpeg[..2].to_vec();
    out.extend([0xFF, 0xE1]);
    out.extend(((exif.len() + 2) as u16).to_be_bytes());
    out.extend(exif);
    out.extend(&jpeg[2..]);
    out
}

pub(crate) const F35: u16 = 0xA405;
const FOCAL: u16 = 0x920A;
const PLANE_X: u16 = 0xA20E;
const PLANE_UNIT: u16 = 0xA210;
const PIXEL_X: u16 = 0xA002;
const ORIENTATION: u16 = 0x0112;

pub(crate) fn degrees(half_tan: f64) -> f64 {
    (2.0 * half_tan.atan()).to_degrees()
}

/// The photos, and the field of view each should get (None: estimated).
fn photos(dir: &Path) -> Vec<(&'static str, Option<f64>, &'static str)> {
    let diag = 36f64.hypot(24.0);
    let write = |name: &str, bytes: Vec<u8>| std::fs::write(dir.join(name), bytes).unwrap();
    // 35 mm equivalent on a 4:3 landscape photo: the full frame's diagonal field of view, over
    // this photo's diagonal.
    write("f35.jpg", jpeg_with_exif(80, 60, Some(exif_block(&[], &[(F35, V::Short(26))]))));
    // The same camera held upright: stored landscape, shown portrait (Orientation 6).
    write("f35_rotated.jpg", jpeg_with_exif(80, 60, Some(exif_block(&[(ORIENTATION, V::Short(6))], &[(F35, V::Short(26))]))));
    // Physical: 4.25 mm on a sensor of 160 pixels per cm whose 80 pixels are the photo's width:
    // 68 pixels of focal length.
    let physical = [(PIXEL_X, V::Long(80)), (FOCAL, V::Rational(425, 100)), (PLANE_X, V::Rational(160, 1)), (PLANE_UNIT, V::Short(3))];
    write("physical.jpg", jpeg_with_exif(80, 60, Some(exif_block(&[], &physical))));
    write("plain.jpg", jpeg_with_exif(80, 60, None));
    vec![
        ("f35", Some(degrees(diag / (2.0 * 26.0) * 80.0 / 100.0)), "exif: FocalLengthIn35mmFilm 26 mm"),
        ("f35_rotated", Some(degrees(diag / (2.0 * 26.0) * 60.0 / 100.0)), "exif: FocalLengthIn35mmFilm 26 mm"),
        ("physical", Some(degrees(80.0 / (2.0 * 68.0))), "exif: FocalLength 4.25 mm"),
        ("plain", None, "estimated: no EXIF focal length"),
    ]
}

/// `moge batch PHOTOS -o OUT` with the fixture model, and `extra`.
fn local_batch(photos: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let weights = fixtures().join("tiny_normal.pt");
    run(&[&["batch", photos.to_str().unwrap(), "-o", out.to_str().unwrap(), "--weights", weights.to_str().unwrap(), "--precision", "f32"], extra].concat())
}

fn check(out: &Path, expected: &[(&str, Option<f64>, &str)]) {
    for (name, fov, source) in expected {
        let side: Value = serde_json::from_slice(&std::fs::read(out.join(format!("{name}.json"))).unwrap()).unwrap();
        let used = side["fov_x"].as_f64().unwrap();
        let said = side["inference"]["fov_x_source"].as_str().unwrap();
        assert!(said.starts_with(source), "{name}: {said}");
        match fov {
            Some(want) => {
                assert!((used - want).abs() < 1e-3, "{name}: fov_x {used}, the tags say {want}");
                assert!((side["inference"]["fov_x_given"].as_f64().unwrap() - want).abs() < 1e-3, "{name}");
            }
            // The model's own estimate: not any of the tags' values.
            None => assert!(
                side["inference"]["fov_x_given"].is_null() && expected.iter().all(|(_, f, _)| f.is_none_or(|f| (used - f).abs() > 0.01)),
                "{name}: {used}"
            ),
        }
    }
}

#[test]
fn fov_x_exif_uses_the_cameras_focal_length() {
    let dir = tempfile::tempdir().unwrap();
    let photos_dir = dir.path().join("photos");
    std::fs::create_dir(&photos_dir).unwrap();
    let expected = photos(&photos_dir);
    let out = dir.path().join("out");
    let r = local_batch(&photos_dir, &out, &["--fov-x", "exif", "--format", "npz,json"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    check(&out, &expected);
    // The rotated photo is shown portrait, as the orientation says.
    let side: Value = serde_json::from_slice(&std::fs::read(out.join("f35_rotated.json")).unwrap()).unwrap();
    assert_eq!((side["width"].as_u64(), side["height"].as_u64()), (Some(60), Some(80)));

    // Through a server: the photo's own field of view goes with it, and the outputs are the same.
    let server = Server::start(&[]);
    let remote = dir.path().join("remote");
    let args = ["batch", photos_dir.to_str().unwrap(), "-o", remote.to_str().unwrap(), "--server", &server.url, "--fov-x", "exif", "--format", "npz,json"];
    let r = run(&args);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    check(&remote, &expected);
    for (name, ..) in &expected {
        let f = format!("{name}.npz");
        assert!(std::fs::read(out.join(&f)).unwrap() == std::fs::read(remote.join(&f)).unwrap(), "{f} differs");
    }

    // Without `exif`, the tags are not read.
    let plain = dir.path().join("plain");
    assert!(local_batch(&photos_dir, &plain, &["--format", "json"]).status.success());
    let side: Value = serde_json::from_slice(&std::fs::read(plain.join("f35.json")).unwrap()).unwrap();
    assert_eq!(side["inference"]["fov_x_source"], "estimated");
    assert!((side["fov_x"].as_f64().unwrap() - expected[0].1.unwrap()).abs() > 0.01);
}

#[test]
fn fov_x_takes_degrees_or_exif_and_nothing_else() {
    let r = run(&["batch", ".", "-o", "out", "--fov-x", "wide"]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("'wide' is not a number of degrees or `exif`"));
}

#[test]
fn a_centred_camera_matrix_gives_each_photo_its_field_of_view_from_fx() {
    let dir = tempfile::tempdir().unwrap();
    let photos_dir = dir.path().join("photos");
    std::fs::create_dir(&photos_dir).unwrap();
    std::fs::write(photos_dir.join("a.jpg"), jpeg_with_exif(80, 60, None)).unwrap();
    // One camera's photos: one size.
    std::fs::write(photos_dir.join("b.jpg"), jpeg_with_exif(80, 60, Some(exif_block(&[], &[(PIXEL_X, V::Long(80))])))).unwrap();
    let weights = fixtures().join("tiny_normal.pt");
    let batch = |out: &Path, k: &str| {
        run(&[
            "batch",
            photos_dir.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--weights",
            weights.to_str().unwrap(),
            "--precision",
            "f32",
            "--intrinsics",
            k,
            "--format",
            "json",
        ])
    };
    // A centred camera with square pixels: used as it is, nothing said.
    let out = dir.path().join("centred");
    let r = batch(&out, "70,70,40,30");
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{stderr}");
    assert!(!stderr.contains("--intrinsics"), "{stderr}");
    for (name, w) in [("a", 80.0), ("b", 80.0)] {
        let side: Value = serde_json::from_slice(&std::fs::read(out.join(format!("{name}.json"))).unwrap()).unwrap();
        let want = degrees(w / (2.0 * 70.0));
        assert!((side["fov_x"].as_f64().unwrap() - want).abs() < 1e-3, "{name}: {} against {want}", side["fov_x"]);
        assert_eq!(side["inference"]["fov_x_source"], "intrinsics fx 70 fy 70 cx 40 cy 30", "{name}");
    }
    // Four numbers, positive focal lengths; not with --fov-x.
    for bad in ["70,70,40", "0,70,40,30", "a,b,c,d"] {
        let r = batch(&dir.path().join("bad"), bad);
        assert_eq!(r.status.code(), Some(2), "{bad}");
    }
    let r = run(&["batch", ".", "-o", "x", "--intrinsics", "70,70,40,30", "--fov-x", "60"]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("cannot be used with"));
}

/// `tests/fixtures/images/exif_f35_26mm_80x60.jpg`, which the bindings' tests read for
/// `fov_x="exif"` (a 35 mm equivalent focal length of 26 mm on an 80x60 photo), is what
/// [`jpeg_with_exif`] writes: `MOGE_UPDATE_FIXTURES=1 cargo test --test it exif_focal::` makes it.
#[test]
fn the_bindings_exif_fixture_is_what_this_writer_makes() {
    let path = fixtures().join("images/exif_f35_26mm_80x60.jpg");
    let made = jpeg_with_exif(80, 60, Some(exif_block(&[], &[(F35, V::Short(26))])));
    if std::env::var_os("MOGE_UPDATE_FIXTURES").is_some() {
        std::fs::write(&path, &made).unwrap();
    }
    assert!(std::fs::read(&path).unwrap_or_default() == made, "{} is stale: MOGE_UPDATE_FIXTURES=1 remakes it", path.display());
}

/// EXIF as tools write it (`tests/make_exif_fixtures.py`: piexif, PIL, exiftool, each a 35 mm
/// equivalent of 26 mm on an 80x60 photo): every one is read, piexif's Exif IFD without its
/// next-IFD offset included; an EXIF that cannot be read is said to be so, with the reason.
#[test]
fn exif_written_by_piexif_pil_and_exiftool_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let photos = fixtures().join("images/exif_tools");
    let out = dir.path().join("out");
    let r = local_batch(&photos, &out, &["--fov-x", "exif", "--format", "json"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let want = degrees(36f64.hypot(24.0) / (2.0 * 26.0) * 80.0 / 100.0);
    let side = |name: &str| -> Value { serde_json::from_slice(&std::fs::read(out.join(format!("{name}.json"))).unwrap()).unwrap() };
    for name in ["piexif", "pil", "exiftool"] {
        let s = side(name);
        assert!((s["fov_x"].as_f64().unwrap() - want).abs() < 1e-3, "{name}: fov_x {} against the tags' {want}", s["fov_x"]);
        assert_eq!(s["inference"]["fov_x_source"], "exif: FocalLengthIn35mmFilm 26 mm", "{name}");
    }
    let s = side("unreadable");
    let said = s["inference"]["fov_x_source"].as_str().unwrap();
    assert!(said.starts_with("estimated: EXIF unreadable: ") && said.len() > "estimated: EXIF unreadable: ".len() + 3, "{said}");
    assert!((s["fov_x"].as_f64().unwrap() - want).abs() > 0.01);
}
