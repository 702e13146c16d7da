//! The fast host paths give the numbers of the plain ones the parity tests hold against upstream,
//! bit for bit:
//! - the one-pass post-processing (`Model::postprocess`) and the two-step path
//!   (`support::two_step`: `forward_maps`, upstream's `forward()` output, then `postprocess`), over
//!   every option, remap and head combination, up- and down-sampling, odd sizes, and mask logits
//!   at the sigmoid's 0.5 edge;
//! - the antialiased resize straight from 8-bit RGB (`Model::prepare`) and the one of a float
//!   image (`resize_bilinear_antialias`);
//! - the PNG codes and the depth statistics against their plain definitions.
//!
//! The fast paths are compiled once per ISA level (AVX-512, AVX2, baseline): each level this
//! machine has is held to the same bits.

use moge::geometry::resize::{resize_bilinear_antialias, resize_rgb8_antialias};
use moge::infer::{InferOptions, Prediction};
use moge::model::config::RemapOutput;
use moge::model::RawOutput;
use moge::simd::isa;

use crate::support::paths::fixtures;
use crate::support::rng::Rng;
use crate::support::two_step::{forward_maps, postprocess};

fn raw(rng: &mut Rng, (h, w): (usize, usize), normal: bool, mask: bool, scale: bool) -> RawOutput {
    let n = h * w;
    let mut points: Vec<f32> = (0..3 * n).map(|i| if i < 2 * n { rng.unit() } else { 0.5 + 1.5 * rng.unit() }).collect();
    // A few non-finite head outputs: the solve leaves them out, the maps carry them.
    points[2 * n + rng.below(n)] = f32::NAN;
    points[rng.below(n)] = f32::INFINITY;
    let normal = normal.then(|| {
        let mut v: Vec<f32> = (0..3 * n).map(|_| rng.unit()).collect();
        let i = rng.below(n);
        for c in 0..3 {
            v[c * n + i] = 0.0; // a zero vector: normalised by the 1e-12 floor
        }
        v
    });
    let mask = mask.then(|| {
        // Logits around the threshold, including values so small that sigmoid rounds to 0.5.
        let edge = [0.0, -0.0, 1e-8, -1e-8, 2.4e-7, 3e-7, 6e-8, 1.0, -1.0, 0.9999999, -0.9999999];
        (0..n).map(|i| if i % 5 == 0 { edge[rng.below(edge.len())] } else { 4.0 * rng.unit() + 0.5 }).collect()
    });
    RawOutput { size: (h, w), points, normal, mask, metric_scale: scale.then(|| 0.3 * rng.unit()), ..RawOutput::default() }
}

fn same(name: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{name}: length");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()), "{name}[{i}]: {x} vs {y}");
    }
}

fn assert_identical(what: &str, fused: &Prediction, two_step: &Prediction) {
    same(&format!("{what} points"), &fused.points, &two_step.points);
    same(&format!("{what} depth"), &fused.depth, &two_step.depth);
    assert_eq!(fused.normal.is_some(), two_step.normal.is_some(), "{what}: normal present");
    if let (Some(a), Some(b)) = (&fused.normal, &two_step.normal) {
        same(&format!("{what} normal"), a, b);
    }
    assert!(fused.mask == two_step.mask, "{what}: mask differs");
    assert_eq!(fused.intrinsics, two_step.intrinsics, "{what}: intrinsics");
    assert_eq!(fused.metric_scale.to_bits(), two_step.metric_scale.to_bits(), "{what}: metric scale");
    assert_eq!((fused.focal.to_bits(), fused.shift.to_bits()), (two_step.focal.to_bits(), two_step.shift.to_bits()), "{what}: focal, shift");
    assert_eq!((fused.width, fused.height, fused.grid), (two_step.width, two_step.height, two_step.grid), "{what}: sizes");
}

#[test]
fn one_pass_equals_forward_maps_then_postprocess() {
    let mut rng = Rng::new(0x5eed_1234);
    // (head output size, image size): upsampling by non-integer factors, by 1, downsampling,
    // one-pixel-wide maps.
    let sizes = [((16, 32), (61, 97)), ((32, 48), (45, 70)), ((48, 64), (30, 40)), ((16, 16), (16, 16)), ((1, 8), (3, 20)), ((8, 1), (9, 1))];
    let remaps = [RemapOutput::Exp, RemapOutput::Linear, RemapOutput::Sinh, RemapOutput::SinhExp];
    // The post-processing reads the model's remap alone: one model, its remap set per case.
    let mut model = moge::Model::load(&fixtures().join("tiny_normal.pt"), &moge::model::BuildOptions::default()).unwrap();
    let (mut cases, mut levels) = (0, 0);
    let mut masked_pixels = 0;
    for (k, &(size, (width, height))) in sizes.iter().enumerate() {
        for (r, &remap) in remaps.iter().enumerate() {
            model.config.remap_output = remap;
            for variant in 0..8 {
                let (normal, mask, scale) = (variant & 1 == 0, variant & 2 == 0, variant & 4 == 0);
                let raw = raw(&mut rng, size, normal, mask, scale);
                for opts_variant in 0..4 {
                    let opts = InferOptions {
                        force_projection: opts_variant & 1 == 0,
                        apply_mask: opts_variant & 2 == 0,
                        fov_x: ((k + r + variant) % 3 == 0).then_some(55.0),
                        ..InferOptions::default()
                    };
                    let grid = (3, 5);
                    let two_step = postprocess(forward_maps(&raw, remap, width, height), width, height, grid, &opts);
                    // The one-pass route is compiled per ISA level: each gives the same bits.
                    for level in isa::levels() {
                        let fused = isa::with_isa(level, || model.postprocess(&raw, (width, height, grid), &opts));
                        let what = format!("{level}: {size:?} -> {width}x{height}, {remap:?}, normal {normal}, mask {mask}, scale {scale}, {opts:?}");
                        assert_identical(&what, &fused, &two_step);
                        // Without the point map: nothing else changes; with the projection forced
                        // the points are left out (without it they are where depth comes from).
                        let lean = InferOptions { point_map: false, ..opts.clone() };
                        let mut without = isa::with_isa(level, || model.postprocess(&raw, (width, height, grid), &lean));
                        assert_eq!(without.points.is_empty(), opts.force_projection, "{what}: point map left out");
                        without.points = fused.points.clone();
                        assert_identical(&format!("{what}, no point map"), &without, &two_step);
                        // Without the float normals: their PNG codes in their place, the codes
                        // `encode_normal` makes of the floats, and nothing else changed.
                        let codes_only = InferOptions { normal_map: false, ..opts.clone() };
                        let mut coded = isa::with_isa(level, || model.postprocess(&raw, (width, height, grid), &codes_only));
                        assert!(coded.normal.is_none() && coded.has_normal() == normal, "{what}: float normals left out");
                        let want_codes = fused.normal.as_deref().map(moge::geometry::codes::encode_normal);
                        assert!(coded.normal_png == want_codes, "{what}: normal PNG codes");
                        (coded.normal, coded.normal_png) = (fused.normal.clone(), None);
                        assert_identical(&format!("{what}, normal codes only"), &coded, &two_step);
                        masked_pixels += fused.mask.iter().filter(|&&m| !m).count();
                        levels += 1;
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, sizes.len() * remaps.len() * 8 * 4);
    assert_eq!(levels, cases * isa::levels().count());
    // The cases exercise the mask: some pixels invalid, most valid.
    assert!(masked_pixels > 0, "no pixel masked in any case");
}

#[test]
fn resize_from_bytes_equals_resize_of_floats() {
    let mut rng = Rng::new(0xa11a5);
    let lut: [f32; 256] = std::array::from_fn(|v| (v as f64 / 255.0) as f32);
    // (h, w) -> (oh, ow): the photo-to-token-grid downscales, an upscale, same size, one row.
    let cases = [((108, 192), (42, 70)), ((67, 45), (28, 28)), ((30, 40), (56, 70)), ((14, 14), (14, 14)), ((1, 50), (14, 14)), ((301, 7), (14, 28))];
    for ((h, w), (oh, ow)) in cases {
        let rgb: Vec<u8> = (0..3 * h * w).map(|_| rng.below(256) as u8).collect();
        let mut planar = vec![0f32; 3 * h * w];
        for (i, px) in rgb.chunks_exact(3).enumerate() {
            for c in 0..3 {
                planar[c * h * w + i] = lut[px[c] as usize];
            }
        }
        let want = resize_bilinear_antialias(&planar, 3, h, w, oh, ow);
        for level in isa::levels() {
            let got = isa::with_isa(level, || resize_rgb8_antialias(&rgb, h, w, oh, ow));
            same(&format!("{level}: {h}x{w} -> {oh}x{ow}"), &got, &want);
        }
        assert!(want.iter().any(|&v| v > 0.1), "{h}x{w}: an all-dark resize tests little");
    }
}

/// The PNG encodings as they were written first, with `f64::round` / `f32::round`.
fn depth_codes_by_round(depth: &[f32], mask: &[bool], scale: f32) -> (Vec<u16>, usize) {
    let mut saturated = 0;
    let codes = depth
        .iter()
        .zip(mask)
        .map(|(&d, &m)| {
            if !m || !d.is_finite() || d <= 0.0 {
                return 0;
            }
            let v = (d as f64 / scale as f64).round();
            if v > 65535.0 {
                saturated += 1;
                65535
            } else if v < 1.0 {
                saturated += 1;
                1
            } else {
                v as u16
            }
        })
        .collect();
    (codes, saturated)
}

fn prediction_of(depth: Vec<f32>, mask: Vec<bool>) -> Prediction {
    let n = depth.len();
    Prediction {
        width: n,
        height: 1,
        points: vec![0.0; 3 * n],
        depth,
        normal: None,
        normal_png: None,
        mask,
        intrinsics: [[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]],
        metric_scale: 1.0,
        focal: 1.0,
        shift: 0.0,
        per_step: Vec::new(),
        grid: (1, 1),
    }
}

/// A w x h prediction of random depths in [0, 2) with every `invalid_every`-th pixel masked out.
fn random_map(rng: &mut Rng, (w, h): (usize, usize), invalid_every: usize) -> Prediction {
    let mut p = prediction_of((0..w * h).map(|_| 1.0 + rng.unit()).collect(), (0..w * h).map(|i| i % invalid_every != 0).collect());
    (p.width, p.height) = (w, h);
    p
}

#[test]
fn png_encodings_equal_rounding_by_libm() {
    let mut rng = Rng::new(77);
    // Scales of few significant bits (0.75, 0.25) make exact halves: q = k + 0.5 to the last bit.
    for scale in [0.001f32, 0.0001, 0.01, 1.0 / 3.0, 0.75, 0.25] {
        let mut depth: Vec<f32> = (0..200_000).map(|_| (rng.unit() + 1.0) * 40.0).collect();
        // Exact and near halves of a unit, the saturation edges, and what is never a code.
        for k in [0u32, 1, 2, 3, 100, 1000, 65534, 65535, 65536] {
            for off in [-0.5f64, 0.5, 0.49999, 0.50001, 1e-9] {
                let d = ((k as f64 + off) * scale as f64) as f32;
                if d > 0.0 {
                    depth.extend([d, f32::from_bits(d.to_bits() + 1), f32::from_bits(d.to_bits() - 1)]);
                }
            }
        }
        depth.extend([0.0, -0.0, -1.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MIN_POSITIVE, f32::MAX, 1e-30]);
        let mask: Vec<bool> = (0..depth.len()).map(|i| i % 7 != 3).collect();
        let (want, want_sat) = depth_codes_by_round(&depth, &mask, scale);
        let p = prediction_of(depth, mask);
        for level in isa::levels() {
            isa::with_isa(level, || {
                let (got, got_sat) = moge::outputs::png::encode_depth(&p, scale);
                assert_eq!(got, want, "{level}: depth codes at scale {scale}");
                assert_eq!(got_sat, want_sat, "{level}: saturated count at scale {scale}");
                assert_eq!(moge::outputs::png::count_saturated(&p, scale), want_sat, "{level}");
            });
        }
        assert!(want_sat > 0 && want.contains(&65535) && want.contains(&0));
    }
    let mut n: Vec<f32> = (0..300_000).map(|_| 1.2 * rng.unit()).collect();
    // Components whose code sits on a half: (v + 0.5) / 255 · 2 − 1, and its neighbours.
    for v in 0..255 {
        let c = ((v as f64 + 0.5) / 255.0 * 2.0 - 1.0) as f32;
        n.extend([c, f32::from_bits(c.to_bits() + 1), f32::from_bits(c.to_bits() - 1)]);
    }
    n.extend([0.0, -0.0, 1.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
    let want: Vec<u8> = n.iter().map(|&c| (((c.clamp(-1.0, 1.0) + 1.0) * 0.5 * 255.0).round()) as u8).collect();
    for level in isa::levels() {
        assert_eq!(isa::with_isa(level, || moge::geometry::codes::encode_normal(&n)), want, "{level}");
    }
}

/// `--npz-normal-dtype float16`: `normal.npy` is a float16 array numpy reads (header checked
/// field by field), its values `astype(np.float16)` of the f32 normals (round to nearest even),
/// and every other entry is the same bytes as in the float32 file.
#[test]
fn npz_float16_normals() {
    use moge::outputs::npz::{write, Compression, NormalDtype};
    use std::io::Read;
    let mut rng = Rng::new(9);
    let (w, h) = (37, 23);
    let mut p = random_map(&mut rng, (w, h), 4);
    let mut n: Vec<f32> = (0..3 * w * h).map(|_| rng.unit()).collect();
    n[..4].copy_from_slice(&[0.0, 1.0, -1.0, 1.0e-5]); // exact, and a subnormal half
    p.normal = Some(n.clone());
    p.points = (0..3 * w * h).map(|_| rng.unit()).collect();
    let dir = tempfile::tempdir().unwrap();
    let read = |path: &std::path::Path| -> std::collections::BTreeMap<String, Vec<u8>> {
        let mut z = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
        (0..z.len())
            .map(|i| {
                let mut e = z.by_index(i).unwrap();
                let mut v = Vec::new();
                e.read_to_end(&mut v).unwrap();
                (e.name().unwrap().to_string(), v)
            })
            .collect()
    };
    for compression in [Compression::None, Compression::Fast] {
        let (a, b) = (dir.path().join("a.npz"), dir.path().join("b.npz"));
        write(&a, &p, compression, NormalDtype::Float16).unwrap();
        write(&b, &p, compression, NormalDtype::Float32).unwrap();
        let (a, b) = (read(&a), read(&b));
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        for (k, v) in &a {
            if k != "normal.npy" {
                assert_eq!(v, &b[k], "{k} differs");
            }
        }
        let npy = &a["normal.npy"];
        assert_eq!(&npy[..8], b"\x93NUMPY\x01\x00");
        let hlen = u16::from_le_bytes([npy[8], npy[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0, "header not padded to 64 bytes");
        let header = std::str::from_utf8(&npy[10..10 + hlen]).unwrap();
        assert!(header.ends_with('\n'));
        assert_eq!(header.trim_end(), format!("{{'descr': '<f2', 'fortran_order': False, 'shape': ({h}, {w}, 3), }}"));
        let data = &npy[10 + hlen..];
        assert_eq!(data.len(), 2 * n.len());
        for (i, (c, &f)) in data.chunks_exact(2).zip(&n).enumerate() {
            assert_eq!(u16::from_le_bytes([c[0], c[1]]), half::f16::from_f32(f).to_bits(), "normal[{i}] = {f}");
        }
    }
}

/// The sidecar's depth statistics as first written: over a copy of the valid depths, with
/// `select_nth_unstable_by` for the median.
#[test]
fn depth_stats_equal_selection_over_a_copy() {
    use moge::outputs::json::DepthStats;
    let mut rng = Rng::new(3);
    let mut cases: Vec<Vec<f32>> = vec![
        (0..100_001).map(|_| 3.0 + 2.0 * rng.unit()).collect(),
        (0..5000).map(|i| (i % 7) as f32).collect(),   // many equal values
        (0..4001).map(|_| 1e3 * rng.unit()).collect(), // negative and positive (no mask head)
        vec![-0.0, 0.0, 0.0, -0.0, 1.0],
        vec![f32::NAN, f32::INFINITY, 2.0, f32::NEG_INFINITY],
        vec![7.5],
        vec![f32::INFINITY; 10],
    ];
    cases.push((0..70_000).map(|i| if i % 3 == 0 { f32::INFINITY } else { 1e-3 * i as f32 }).collect());
    // Sums in eight lanes (pixel i in lane i % 8) are used where every partial sum is exact: a
    // 400x range of depths (exact), and one where summing by lanes would round differently from
    // pixel order.
    cases.push((0..100_001).map(|_| 1.0 + 399.0 * rng.unit().abs()).collect());
    let wide: Vec<f32> = (0..100_001).map(|i| if i % 4 == 1 { 3e7 } else { 0.1 + rng.unit().abs() }).collect();
    let masked_out = |i: usize| i % 11 == 5;
    let in_order: f64 = wide.iter().enumerate().filter(|(i, _)| !masked_out(*i)).map(|(_, &v)| v as f64).sum();
    let by_lanes = (0..8)
        .map(|l| wide.iter().enumerate().skip(l).step_by(8).filter(|(i, _)| !masked_out(*i)).map(|(_, &v)| v as f64).sum::<f64>())
        .fold(-0.0, |a, b| a + b);
    assert_ne!(by_lanes.to_bits(), in_order.to_bits(), "this case must round differently by lanes");
    cases.push(wide);
    for (k, depth) in cases.into_iter().enumerate() {
        let mask: Vec<bool> = (0..depth.len()).map(|i| k == 3 || i % 11 != 5).collect();
        let mut d: Vec<f32> = depth.iter().zip(&mask).filter(|(v, &m)| m && v.is_finite()).map(|(v, _)| *v).collect();
        let want = if d.is_empty() {
            (0, None, None, None, None)
        } else {
            let n = d.len();
            let mean = d.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let (min, max) = d.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
            let (_, med, _) = d.select_nth_unstable_by(n / 2, f32::total_cmp);
            (n, Some(min.to_bits()), Some(max.to_bits()), Some(mean.to_bits()), Some(med.to_bits()))
        };
        let p = prediction_of(depth, mask);
        for level in isa::levels() {
            isa::with_isa(level, || {
                let s = DepthStats::of(&p);
                let got = (s.valid_pixels, s.min.map(f32::to_bits), s.max.map(f32::to_bits), s.mean.map(f64::to_bits), s.median.map(f32::to_bits));
                assert_eq!(got, want, "{level}: case {k}");
            });
        }
    }
}

/// A stored npz is written into blocks reserved ahead of it, then cut to what was written: the
/// file holds exactly the bytes the encoder makes (a tail of reserved zeros would hide the
/// zip's end record from readers that look for it at the end), with and without normals, in
/// both normal layouts, and for a compressed npz, which reserves nothing.
#[test]
fn npz_file_is_exactly_the_encoded_zip() {
    use moge::outputs::npz::{encode, write, Compression, NormalDtype};
    let mut rng = Rng::new(31);
    let (w, h) = (641, 97);
    let mut p = random_map(&mut rng, (w, h), 5);
    p.points = (0..3 * w * h).map(|_| rng.unit()).collect();
    let dir = tempfile::tempdir().unwrap();
    for normal in [false, true] {
        p.normal = normal.then(|| (0..3 * w * h).map(|_| rng.unit()).collect());
        for dtype in [NormalDtype::Float32, NormalDtype::Float16] {
            for compression in [Compression::None, Compression::Fast] {
                let path = dir.path().join("p.npz");
                write(&path, &p, compression, dtype).unwrap();
                let on_disk = std::fs::read(&path).unwrap();
                let encoded = encode(std::io::Cursor::new(Vec::new()), &p, compression, dtype).unwrap().into_inner();
                assert_eq!(on_disk.len(), encoded.len(), "normal {normal}, {dtype:?}, {compression:?}");
                assert!(on_disk == encoded, "normal {normal}, {dtype:?}, {compression:?}: bytes differ");
                assert!(zip::ZipArchive::new(std::io::Cursor::new(on_disk)).unwrap().len() >= 8);
            }
        }
    }
}
