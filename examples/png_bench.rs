//! Time and size of the three PNGs of `--format png` (16-bit depth, RGB normal, mask) under
//! each PNG row filter with fdeflate (the encoder's fast mode), on a 1920x1080 synthetic
//! indoor scene: a box room (floor, walls, ceiling) with spheres in it, seen from a pinhole
//! camera, and a window whose pixels are invalid. Real predictions are like it: smooth
//! surfaces, sharp edges between them. The filters are measured interleaved (the machine is
//! shared: compare within one run).
//!
//! `cargo run --release --example png_bench [reps] [STEM]`: with STEM, the maps are read back from
//! `STEM.depth.png`, `STEM.normal.png` and `STEM.mask.png` (what `moge predict --format png` wrote).

use image::codecs::png::{CompressionType, FilterType, PngEncoder};
use image::{ExtendedColorType, ImageEncoder};
use moge::outputs::png;
use moge::Prediction;
use std::time::Instant;

/// Depth (metres, inf where invalid), unit normals (interleaved) and validity of the scene.
fn scene(w: usize, h: usize) -> (Vec<f32>, Vec<f32>, Vec<bool>) {
    let f = 0.8 * w as f32;
    let (mut depth, mut normal, mut mask) = (vec![0f32; w * h], vec![0f32; 3 * w * h], vec![false; w * h]);
    // Planes n·X = d (room 6 m wide, 3 m high, 8 m deep; camera at 1.5 m height, 0 m from the
    // back wall), then spheres (centre, radius).
    let planes: [([f32; 3], f32); 5] = [([0., -1., 0.], 1.5), ([0., 1., 0.], 1.5), ([1., 0., 0.], 3.0), ([-1., 0., 0.], 3.0), ([0., 0., 1.], 8.0)];
    let spheres: [([f32; 3], f32); 3] = [([-1.0, 0.8, 4.0], 0.7), ([1.2, 1.0, 5.5], 0.5), ([0.3, 1.2, 2.8], 0.3)];
    for y in 0..h {
        for x in 0..w {
            let r = [(x as f32 + 0.5 - w as f32 / 2.0) / f, (y as f32 + 0.5 - h as f32 / 2.0) / f, 1.0];
            let (mut t, mut n) = (f32::INFINITY, [0f32; 3]);
            for (pn, d) in planes {
                let den = pn[0] * r[0] + pn[1] * r[1] + pn[2] * r[2];
                if den > 1e-6 && d / den < t {
                    (t, n) = (d / den, pn.map(|c| -c));
                }
            }
            for (c, rad) in spheres {
                // |t r - c|^2 = rad^2
                let a = r[0] * r[0] + r[1] * r[1] + 1.0;
                let b = r[0] * c[0] + r[1] * c[1] + r[2] * c[2];
                let disc = b * b - a * (c[0] * c[0] + c[1] * c[1] + c[2] * c[2] - rad * rad);
                if disc >= 0.0 {
                    let ts = (b - disc.sqrt()) / a;
                    if ts > 0.0 && ts < t {
                        t = ts;
                        n = [0, 1, 2].map(|k| (ts * r[k] - c[k]) / rad);
                    }
                }
            }
            let i = y * w + x;
            // A window in the back wall: out of reach, invalid.
            let window = t.is_finite() && n[2] < -0.99 && (r[0] * t).abs() < 1.2 && (r[1] * t + 0.3).abs() < 0.6;
            let valid = t.is_finite() && !window;
            depth[i] = if valid { t } else { f32::INFINITY };
            mask[i] = valid;
            if valid {
                normal[3 * i..3 * i + 3].copy_from_slice(&n);
            }
        }
    }
    (depth, normal, mask)
}

fn main() -> anyhow::Result<()> {
    let reps: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(9);
    let stem = std::env::args().nth(2);
    let (w, h, codes, ncodes, mcodes, what) = if let Some(stem) = &stem {
        let depth = image::open(format!("{stem}.depth.png"))?.into_luma16();
        let (w, h) = (depth.width() as usize, depth.height() as usize);
        let normal = image::open(format!("{stem}.normal.png"))?.into_rgb8().into_raw();
        let mask = image::open(format!("{stem}.mask.png"))?.into_luma8().into_raw();
        (w, h, depth.into_raw(), normal, mask, stem.as_str())
    } else {
        let (w, h) = (1920usize, 1080usize);
        let (depth, normal, mask) = scene(w, h);
        // The codes as `moge` writes them (1 mm depth units, the default `--depth-png-scale`).
        let mcodes: Vec<u8> = mask.iter().map(|&m| if m { 255 } else { 0 }).collect();
        let ncodes = moge::geometry::codes::encode_normal(&normal);
        let p = Prediction {
            width: w,
            height: h,
            points: Vec::new(),
            depth,
            normal: None,
            normal_png: None,
            mask,
            intrinsics: [[0.8, 0.0, 0.5], [0.0, 0.8 * w as f32 / h as f32, 0.5], [0.0, 0.0, 1.0]],
            metric_scale: 1.0,
            focal: 0.8,
            shift: 0.0,
            per_step: Vec::new(),
            grid: (1, 1),
        };
        let (codes, _) = png::encode_depth(&p, 0.001);
        (w, h, codes, ncodes, mcodes, "synthetic room")
    };
    let maps: [(&str, &[u8], ExtendedColorType); 3] = [
        ("depth", bytemuck::cast_slice(&codes), ExtendedColorType::L16),
        ("normal", &ncodes, ExtendedColorType::Rgb8),
        ("mask", &mcodes, ExtendedColorType::L8),
    ];
    let filters = [
        ("none", FilterType::NoFilter),
        ("sub", FilterType::Sub),
        ("up", FilterType::Up),
        ("avg", FilterType::Avg),
        ("paeth", FilterType::Paeth),
        ("adaptive", FilterType::Adaptive),
    ];
    // times[map][filter]
    let mut times = vec![vec![Vec::new(); filters.len()]; maps.len()];
    let mut sizes = vec![vec![0usize; filters.len()]; maps.len()];
    for _ in 0..reps {
        for (mi, (_, data, color)) in maps.iter().enumerate() {
            for (fi, (_, filter)) in filters.iter().enumerate() {
                let mut out = Vec::with_capacity(data.len());
                let t = Instant::now();
                PngEncoder::new_with_quality(&mut out, CompressionType::Fast, *filter).write_image(data, w as u32, h as u32, *color)?;
                times[mi][fi].push(t.elapsed().as_secs_f64() * 1e3);
                sizes[mi][fi] = out.len();
            }
        }
    }
    println!("{w}x{h} {what}, fdeflate (CompressionType::Fast), median of {reps}: ms / KiB");
    print!("{:<8}", "filter");
    for (name, _, _) in &maps {
        print!("{:>20}", name);
    }
    println!("{:>12}", "total ms");
    for (fi, (fname, _)) in filters.iter().enumerate() {
        print!("{fname:<8}");
        let mut total = 0.0;
        for mi in 0..maps.len() {
            let t = &mut times[mi][fi];
            t.sort_by(f64::total_cmp);
            let med = t[t.len() / 2];
            total += med;
            print!("{:>11.1} / {:>6}", med, sizes[mi][fi] / 1024);
        }
        println!("{total:>12.1}");
    }
    Ok(())
}
