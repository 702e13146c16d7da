//! HEIC and AVIF photos (the `heif` feature): written in each test by libheif's own encoders
//! (x265 for HEIC, as a phone's; libaom for AVIF) from a PNG, the rotation stored as a phone
//! stores it (an `irot` property); decoded within a JPEG's tolerance of the PNG, the rotation
//! applied, a file cut short refused with the reason, and `moge batch` doing the rest of a
//! directory.

use std::path::{Path, PathBuf};

use image::RgbImage;
use libheif_rs::{Channel, ColorSpace, CompressionFormat, EncoderQuality, HeifContext, Image, LibHeif, RgbChroma};
use moge::image_io::{load_rgb_with, DecodeOptions, FovFrom};

use crate::exif_focal::{degrees, exif_block, F35, V};
use crate::support::cli::run;
use crate::support::paths::fixtures;

/// A photo-like picture: smooth gradients and a few hard edges, which lossy codecs keep well.
fn picture(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        let (u, v) = (x as f32 / w as f32, y as f32 / h as f32);
        let disc = ((u - 0.6).powi(2) + (v - 0.4).powi(2)) < 0.04;
        let bar = (0.15..0.3).contains(&u) && v > 0.5;
        if disc {
            image::Rgb([230, 60, 40])
        } else if bar {
            image::Rgb([30, 40, 200])
        } else {
            image::Rgb([(40.0 + 180.0 * u) as u8, (60.0 + 150.0 * v) as u8, (120.0 + 60.0 * (u - v)) as u8])
        }
    })
}

/// `img` encoded by libheif at quality 90.
fn encode(img: &RgbImage, format: CompressionFormat, path: &Path) {
    encode_with_exif(img, format, path, None)
}

/// [`encode`], with an EXIF item (a TIFF stream) as a camera writes one.
fn encode_with_exif(img: &RgbImage, format: CompressionFormat, path: &Path, exif: Option<&[u8]>) {
    let (w, h) = img.dimensions();
    let mut image = Image::new(w, h, ColorSpace::Rgb(RgbChroma::C444)).unwrap();
    for c in [Channel::R, Channel::G, Channel::B] {
        image.create_plane(c, w, h, 8).unwrap();
    }
    {
        let planes = image.planes_mut();
        for (i, plane) in [planes.r, planes.g, planes.b].into_iter().enumerate() {
            let plane = plane.unwrap();
            for y in 0..h as usize {
                for x in 0..w as usize {
                    plane.data[y * plane.stride + x] = img.get_pixel(x as u32, y as u32)[i];
                }
            }
        }
    }
    let lib = LibHeif::new();
    let mut ctx = HeifContext::new().unwrap();
    let mut encoder = lib.encoder_for_format(format).unwrap();
    encoder.set_quality(EncoderQuality::Lossy(90)).unwrap();
    let handle = ctx.encode_image(&image, &mut encoder, None).unwrap();
    if let Some(tiff) = exif {
        ctx.add_exif_metadata(&handle, tiff).unwrap();
    }
    ctx.write_to_file(path.to_str().unwrap()).unwrap();
}

/// The boxes of an ISO base media byte range: (type, start of the box, start of its payload,
/// end).
fn boxes(b: &[u8], from: usize, to: usize) -> Vec<([u8; 4], usize, usize, usize)> {
    let mut out = Vec::new();
    let mut at = from;
    while at + 8 <= to {
        let size = u32::from_be_bytes(b[at..at + 4].try_into().unwrap()) as usize;
        out.push((b[at + 4..at + 8].try_into().unwrap(), at, at + 8, at + size));
        at += size;
    }
    out
}

fn be(b: &[u8], at: usize, n: usize) -> u64 {
    b[at..at + n].iter().fold(0, |v, &x| v << 8 | x as u64)
}

fn put_be(b: &mut [u8], at: usize, n: usize, v: u64) {
    for i in 0..n {
        b[at + i] = (v >> (8 * (n - 1 - i))) as u8;
    }
}

/// `heif` with an `irot` property (`quarter_turns` counter-clockwise, as HEIF counts them) on
/// its primary image, as a phone writes it. libheif 1.15's encoder does not write one, so it
/// is added here: the box appended to `ipco`, associated in `ipma`, the enclosing sizes grown,
/// and `iloc`'s offsets into `mdat` (after `meta`) moved by what was inserted.
fn with_irot(heif: &[u8], quarter_turns: u8) -> Vec<u8> {
    let top = boxes(heif, 0, heif.len());
    let &(_, meta, meta_body, meta_end) = top.iter().find(|b| &b.0 == b"meta").unwrap();
    let children = boxes(heif, meta_body + 4, meta_end);
    let find = |list: &[([u8; 4], usize, usize, usize)], kind: &[u8; 4]| *list.iter().find(|b| &b.0 == kind).unwrap();
    let (_, iprp, iprp_body, iprp_end) = find(&children, b"iprp");
    let (_, iloc, iloc_body, _) = find(&children, b"iloc");
    let (_, pitm, _, _) = find(&children, b"pitm");
    let primary = be(heif, pitm + 12, 2);
    let props = boxes(heif, iprp_body, iprp_end);
    let (_, ipco, ipco_body, ipco_end) = find(&props, b"ipco");
    let (_, ipma, _, ipma_end) = find(&props, b"ipma");
    let index = boxes(heif, ipco_body, ipco_end).len() as u64 + 1;
    // ipma: version, flags (bit 0: 15-bit indices), entries of item, count, associations.
    let (version, wide) = (heif[ipma + 8], heif[ipma + 11] & 1 == 1);
    let mut assoc = if wide { ((1u64 << 15) | index).to_be_bytes()[6..].to_vec() } else { vec![0x80 | index as u8] };
    let mut new_ipma = heif[ipma..ipma_end].to_vec();
    let (mut at, id_len) = (16, if version == 0 { 2 } else { 4 });
    let entries = be(heif, ipma + 12, 4);
    for _ in 0..entries {
        let id = be(&new_ipma, at, id_len);
        let count = new_ipma[at + id_len] as usize;
        let len = count * if wide { 2 } else { 1 };
        if id == primary {
            new_ipma[at + id_len] += 1;
            let end = at + id_len + 1 + len;
            new_ipma.splice(end..end, assoc.drain(..));
            break;
        }
        at += id_len + 1 + len;
    }
    assert!(assoc.is_empty(), "the primary item has no ipma entry");
    let grown = new_ipma.len() - (ipma_end - ipma);
    let n = new_ipma.len() as u64;
    put_be(&mut new_ipma, 0, 4, n);
    let irot = [0, 0, 0, 9, b'i', b'r', b'o', b't', quarter_turns & 3];
    let delta = (irot.len() + grown) as u64;
    let mut out = heif[..ipco_end].to_vec();
    out.extend(irot);
    out.extend(&heif[ipco_end..ipma]);
    out.extend(new_ipma);
    out.extend(&heif[ipma_end..]);
    for (start, add) in [(meta, delta), (iprp, delta), (ipco, irot.len() as u64)] {
        let v = be(&out, start, 4);
        put_be(&mut out, start, 4, v + add);
    }
    // iloc (it comes before iprp, so its place is unchanged): every item's data moves by delta.
    let v = out[iloc + 8];
    let (off, len, base, idx) =
        ((out[iloc_body + 4] >> 4) as usize, (out[iloc_body + 4] & 15) as usize, (out[iloc_body + 5] >> 4) as usize, (out[iloc_body + 5] & 15) as usize);
    let mut at = iloc_body + 6;
    let (count, id_len) = if v < 2 { (be(&out, at, 2), 2) } else { (be(&out, at, 4), 4) };
    at += if v < 2 { 2 } else { 4 };
    for _ in 0..count {
        at += id_len;
        let in_file = v == 0 || out[at + 1] & 15 == 0;
        at += if v == 0 { 0 } else { 2 } + 2;
        let base_at = at;
        at += base;
        let extents = be(&out, at, 2);
        at += 2;
        for _ in 0..extents {
            at += if v > 0 { idx } else { 0 };
            if in_file && base == 0 {
                let o = be(&out, at, off);
                put_be(&mut out, at, off, o + delta);
            }
            at += off + len;
        }
        if in_file && base > 0 {
            let o = be(&out, base_at, base);
            put_be(&mut out, base_at, base, o + delta);
        }
    }
    out
}

/// Mean absolute difference per sample.
fn mean_abs_diff(a: &RgbImage, b: &RgbImage) -> f64 {
    assert_eq!(a.dimensions(), b.dimensions());
    a.as_raw().iter().zip(b.as_raw()).map(|(&x, &y)| (x as f64 - y as f64).abs()).sum::<f64>() / a.as_raw().len() as f64
}

fn formats(dir: &Path) -> Vec<(&'static str, PathBuf, CompressionFormat)> {
    vec![("HEIC/HEIF", dir.join("IMG_0001.HEIC"), CompressionFormat::Hevc), ("AVIF", dir.join("shot.avif"), CompressionFormat::Av1)]
}

#[test]
fn heic_and_avif_decode_within_a_jpegs_tolerance_with_their_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let upright = picture(160, 120);
    // What a JPEG at quality 90 of the same picture differs by: the tolerance.
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90).encode_image(&upright).unwrap();
    let jpeg_diff = mean_abs_diff(&image::load_from_memory(&jpeg).unwrap().to_rgb8(), &upright);
    for (kind, path, format) in formats(dir.path()) {
        encode(&upright, format, &path);
        let got = load_rgb_with(&path, &DecodeOptions::default()).unwrap_or_else(|e| panic!("{kind}: {e:#}"));
        let d = mean_abs_diff(&got.image, &upright);
        assert!(d <= jpeg_diff.max(1.0) * 2.0, "{kind}: mean difference {d:.2} against the PNG (JPEG q90: {jpeg_diff:.2})");

        // Stored as the sensor saw it, with `irot` to show it upright (90 degrees clockwise =
        // three quarter turns counter-clockwise): turned here.
        let sensor = image::imageops::rotate270(&upright);
        let stored = path.with_extension(format!("stored.{}", path.extension().unwrap().to_str().unwrap()));
        encode(&sensor, format, &stored);
        let turned = path.with_extension(format!("turned.{}", path.extension().unwrap().to_str().unwrap()));
        std::fs::write(&turned, with_irot(&std::fs::read(&stored).unwrap(), 3)).unwrap();
        let shown = load_rgb_with(&turned, &DecodeOptions::default()).unwrap().image;
        assert_eq!(shown.dimensions(), (160, 120), "{kind}: the rotation applied");
        assert!(mean_abs_diff(&shown, &upright) <= jpeg_diff.max(1.0) * 2.0, "{kind}: turned the right way");
    }
}

#[test]
fn cut_heic_and_avif_are_refused_and_a_batch_does_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let photos = dir.path().join("phone");
    std::fs::create_dir(&photos).unwrap();
    std::fs::copy(fixtures().join("images/rgb_64x48.png"), photos.join("ok.png")).unwrap();
    for (_, path, format) in formats(&photos) {
        encode(&picture(128, 96), format, &path);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(path.with_file_name(format!("cut-{}", path.file_name().unwrap().to_str().unwrap())), &bytes[..bytes.len() * 2 / 3]).unwrap();
    }
    let out = dir.path().join("out");
    let weights = fixtures().join("tiny_normal.pt");
    let o = run(&["batch", photos.to_str().unwrap(), "-o", out.to_str().unwrap(), "--weights", weights.to_str().unwrap(), "--num-tokens", "300"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("3 done, 2 failed"), "{stderr}");
    for (kind, path, _) in formats(&photos) {
        assert!(out.join(path.file_stem().unwrap()).with_extension("npz").exists(), "{kind} done");
        let cut = format!("cut-{}", path.file_name().unwrap().to_str().unwrap());
        let line = stderr.lines().find(|l| l.contains(&cut)).unwrap_or_else(|| panic!("{cut} not named: {stderr}"));
        assert!(line.contains(&format!("truncated {kind}")) || line.contains(&format!("damaged {kind}")), "{line}");
        assert!(!out.join(Path::new(&cut).file_stem().unwrap()).with_extension("npz").exists());
    }
}

#[test]
fn fov_x_exif_reads_the_exif_item_of_heic_and_avif_for_the_photo_as_shown() {
    let dir = tempfile::tempdir().unwrap();
    // The APP1 payload less its "Exif\0\0": the TIFF stream that HEIF stores.
    let app1 = exif_block(&[], &[(F35, V::Short(26))]);
    let tiff = &app1[6..];
    let diag = 36f64.hypot(24.0);
    let want = degrees(diag / (2.0 * 26.0) * 160.0 / 200.0);
    let opts = DecodeOptions { fov: FovFrom::Exif, ..Default::default() };
    for (kind, path, format) in formats(dir.path()) {
        encode_with_exif(&picture(160, 120), format, &path, Some(tiff));
        let got = load_rgb_with(&path, &opts).unwrap().known_fov.unwrap_or_else(|| panic!("{kind}: no field of view from EXIF"));
        assert!((got.degrees as f64 - want).abs() < 1e-3, "{kind}: {} vs {want}", got.degrees);
        assert!(got.from.contains("FocalLengthIn35mmFilm 26"), "{}", got.from);
        // Stored upright-turned with irot: the field of view is of the width as shown.
        let stored = path.with_extension(format!("stored.{}", path.extension().unwrap().to_str().unwrap()));
        encode_with_exif(&image::imageops::rotate270(&picture(160, 120)), format, &stored, Some(tiff));
        let turned = path.with_extension(format!("turned.{}", path.extension().unwrap().to_str().unwrap()));
        std::fs::write(&turned, with_irot(&std::fs::read(&stored).unwrap(), 3)).unwrap();
        let got = load_rgb_with(&turned, &opts).unwrap();
        assert_eq!(got.image.dimensions(), (160, 120));
        assert!((got.known_fov.unwrap().degrees as f64 - want).abs() < 1e-3, "{kind} turned");
        // Without the tags: the model's estimate.
        let plain = path.with_extension(format!("plain.{}", path.extension().unwrap().to_str().unwrap()));
        encode(&picture(160, 120), format, &plain);
        assert!(load_rgb_with(&plain, &opts).unwrap().known_fov.is_none());
    }
}
