//! Panoramas against upstream's own functions (`moge.utils.panorama` of dlr-moge 2.0.0) on the
//! fixture `tests/fixtures/panorama/tiny_384x192.npz` (`tests/make_panorama_fixtures.py`): the
//! views' cameras and pictures, OpenCV's remaps and resizes, the merge from the reference's own
//! view maps, and the whole panorama through the model.

use moge::panorama::{self, cameras, merge, split};

use crate::support::npz::Npz;
use crate::support::paths::fixtures;
use crate::support::reference::pcc;

fn fixture() -> Npz {
    Npz::open(&fixtures().join("panorama/tiny_384x192.npz"))
}

fn bools(v: &[u8]) -> Vec<bool> {
    v.iter().map(|&b| b != 0).collect()
}

fn agreement(a: &[bool], b: &[bool]) -> f64 {
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64
}

fn median_rel(a: &[f32], b: &[f32]) -> f64 {
    let mut r: Vec<f64> = a.iter().zip(b).map(|(&x, &y)| ((x - y) / y).abs() as f64).collect();
    moge::geometry::median(&mut r)
}

/// `moge panorama INPUT -o OUT` as the fixture was made (the tiny model in f32, the fixture's
/// view size and tokens), then `extra`.
fn panorama_cli(z: &mut Npz, input: &std::path::Path, out: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let size = z.i64("view_size").into_raw_vec_and_offset().0[0].to_string();
    let tokens = z.i64("num_tokens").into_raw_vec_and_offset().0[0].to_string();
    let weights = fixtures().join("tiny_normal.pt");
    let mut args = vec!["panorama", input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--weights", weights.to_str().unwrap()];
    args.extend(["--precision", "f32", "--view-size", &size, "--num-tokens", &tokens]);
    args.extend(extra);
    crate::support::cli::run(&args)
}

#[test]
fn the_views_cameras_are_upstreams() {
    let mut z = fixture();
    let ext = z.vec_f32("extrinsics");
    let k = z.vec_f32("intrinsics");
    assert_eq!((k[0], k[4], k[2], k[5]), (0.5, 0.5, 0.5, 0.5), "fov 90 x 90, centred");
    let views = cameras::views();
    assert_eq!(views.len() * 16, ext.len());
    for (i, v) in views.iter().enumerate() {
        for r in 0..3 {
            for c in 0..3 {
                let want = ext[i * 16 + r * 4 + c];
                assert!((v.rotation[r][c] - want).abs() < 1e-6, "view {i} R[{r}][{c}] {} vs {want}", v.rotation[r][c]);
            }
            assert_eq!(ext[i * 16 + r * 4 + 3], 0.0, "the views sit at the centre");
        }
    }
}

#[test]
fn opencv_remaps_and_resizes_are_reproduced() {
    use moge::geometry::remap;
    let mut z = fixture();
    let (mx, my) = (z.vec_f32("remap_x"), z.vec_f32("remap_y"));
    let src = z.u8("remap_src_u8");
    let (h, w) = (src.shape()[0], src.shape()[1]);
    let got = remap::rgb8_linear(src.as_slice().unwrap(), w, h, &mx, &my);
    assert_eq!(got, z.u8("remap_u8_linear_constant").into_raw_vec_and_offset().0, "8-bit bilinear, black border");
    let srcf = z.vec_f32("remap_src_f32");
    let got = remap::f32_linear_replicate(&srcf, w, h, &mx, &my);
    let want = z.vec_f32("remap_f32_linear_replicate");
    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
        assert!((g - e).abs() <= 1e-6 * e.abs().max(1.0), "float bilinear at {i}: {g} vs {e}");
    }
    let srcm = z.u8("remap_src_mask").into_raw_vec_and_offset().0;
    let got: Vec<u8> = mx.iter().zip(&my).map(|(&x, &y)| remap::u8_nearest_replicate_at(&srcm, w, h, x, y)).collect();
    assert_eq!(got, z.u8("remap_mask_nearest_replicate").into_raw_vec_and_offset().0, "nearest, replicated border");

    // The final resizes of `assemble`: a 40 x 20 merge to a 97 x 50 picture.
    let m = merge::Merged {
        width: 40,
        height: 20,
        distance: z.vec_f32("resize_f32_src"),
        mask: bools(&z.u8("resize_mask_src").into_raw_vec_and_offset().0),
        log_offsets: vec![0.0],
        iterations: vec![],
    };
    let a = panorama::assemble(&m, 97, 50);
    assert_eq!(a.scale, 1.0);
    let want = z.vec_f32("resize_f32_97x50");
    for (g, e) in a.distance.iter().zip(&want) {
        assert!((g - e).abs() <= 1e-5 * e.abs(), "{g} vs {e}");
    }
    let want_mask = bools(&z.u8("resize_mask_97x50").into_raw_vec_and_offset().0);
    let off: Vec<usize> = (0..want_mask.len()).filter(|&i| a.mask[i] != want_mask[i]).collect();
    assert!(off.is_empty(), "the resized mask differs at {} pixels: {:?}", off.len(), &off[..off.len().min(20)]);
}

#[test]
fn the_views_pictures_are_upstreams() {
    let mut z = fixture();
    let size = z.i64("view_size").into_raw_vec_and_offset().0[0] as usize;
    let pano = image::open(fixtures().join("images/pano_384x192.png")).unwrap().to_rgb8();
    let views = split::split(&pano, &cameras::views(), size);
    let want = z.u8("views").into_raw_vec_and_offset().0;
    let got: Vec<u8> = views.iter().flat_map(|v| v.as_raw().iter().copied()).collect();
    assert_eq!(got.len(), want.len());
    let off = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    let worst = got.iter().zip(&want).map(|(&a, &b)| a.abs_diff(b)).max().unwrap();
    // A coordinate that lands on a 1/32 boundary in float64 here and float32 there may round
    // the other way: a handful of values, by a level or so.
    assert!(off * 10_000 <= got.len() && worst <= 8, "{off} of {} values differ, by up to {worst}", got.len());
}

/// The reference's own view maps, as the merge takes them.
fn reference_views(z: &mut Npz) -> (usize, Vec<Vec<f32>>, Vec<Vec<bool>>) {
    let size = z.i64("view_size").into_raw_vec_and_offset().0[0] as usize;
    let d = z.vec_f32("view_distance");
    let m = bools(&z.u8("view_mask").into_raw_vec_and_offset().0);
    let n = size * size;
    (size, d.chunks(n).map(<[f32]>::to_vec).collect(), m.chunks(n).map(<[bool]>::to_vec).collect())
}

#[test]
fn the_merge_matches_upstreams_solve_on_the_same_views() {
    let mut z = fixture();
    let (size, d, m) = reference_views(&mut z);
    let views: Vec<_> = d.iter().zip(&m).map(|(d, m)| merge::ViewDistance { size, distance: d, mask: m }).collect();
    let cams = cameras::views();
    let stop = panorama::lsmr::Stop::UPSTREAM;

    // One level (192 x 96 starts from zero), then two (384 x 192 from the 192 x 96 solution).
    for (key, (w, h)) in [("coarse", (192, 96)), ("merged", (384, 192))] {
        let got = merge::merge(w, h, &cams, &views, &stop).unwrap();
        let want = z.vec_f32(key);
        let want_mask = bools(&z.u8(&format!("{key}_mask")).into_raw_vec_and_offset().0);
        let (p, rel, agree) = (pcc(&got.distance, &want), median_rel(&got.distance, &want), agreement(&got.mask, &want_mask));
        eprintln!("{key}: PCC {p:.7}, median rel {rel:.2e}, mask {agree:.5}, LSMR iterations {:?}", got.iterations);
        assert!(p >= 0.9999 && rel <= 1e-3 && agree >= 0.995, "{key}: PCC {p}, median rel {rel}, mask {agree}");
        if key == "merged" {
            let want_off = z.f64("view_log_offsets").into_raw_vec_and_offset().0;
            for (g, e) in got.log_offsets.iter().zip(&want_off) {
                assert!((g - e).abs() < 1e-5, "view offsets {:?} vs {want_off:?}", got.log_offsets);
            }
            let factor = z.f64("metric_factor").into_raw_vec_and_offset().0[0];
            let a = panorama::assemble(&got, w, h);
            assert!((a.scale as f64 / factor - 1.0).abs() < 1e-5, "scale {} vs {factor}", a.scale);
        }
    }
}

#[test]
fn the_views_through_the_model_match_upstreams() {
    let mut z = fixture();
    let (size, want_d, want_m) = reference_views(&mut z);
    let tokens = z.i64("num_tokens").into_raw_vec_and_offset().0[0] as u32;
    let pictures = z.u8("views").into_raw_vec_and_offset().0;
    let model = crate::support::reference::load("tiny_normal.pt");
    let opts = moge::InferOptions { num_tokens: Some(tokens), fov_x: Some(90.0), apply_mask: false, ..Default::default() };
    for (i, px) in pictures.chunks(3 * size * size).enumerate() {
        let img = image::RgbImage::from_raw(size as u32, size as u32, px.to_vec()).unwrap();
        let p = model.infer(&img, &opts).unwrap();
        let d: Vec<f32> = p.points.chunks(3).map(|q| (q[0] * q[0] + q[1] * q[1] + q[2] * q[2]).sqrt()).collect();
        let rel = median_rel(&d, &want_d[i]);
        let worst = d.iter().zip(&want_d[i]).map(|(a, b)| ((a - b) / b).abs()).fold(0f32, f32::max);
        let agree = agreement(&p.mask, &want_m[i]);
        eprintln!("view {i}: median rel {rel:.2e}, worst {worst:.2e}, mask {agree:.5}");
        // moge's shift is the converged minimum, the reference's scipy's at tolerance 1e-14 (in
        // float32 residuals): the views agree to ~1e-3.
        assert!(rel <= 1.5e-3 && worst <= 2e-2 && agree >= 0.999, "view {i}: median rel {rel}, worst {worst}, mask {agree}");
    }
}

/// `moge panorama` on the fixture panorama, as upstream's command runs it (the views at the
/// fixture's size and tokens), against the reference carried to metric scale; a picture that is
/// not a panorama, a damaged one and a too-small one each get their reason, and the rest of
/// the run completes.
#[test]
fn the_command_makes_upstreams_panorama_at_metric_scale() {
    let mut z = fixture();
    let dir = tempfile::tempdir().unwrap();
    let inputs = dir.path().join("in");
    std::fs::create_dir(&inputs).unwrap();
    std::fs::copy(fixtures().join("images/pano_384x192.png"), inputs.join("pano.png")).unwrap();
    std::fs::copy(fixtures().join("images/rgb_64x48.png"), inputs.join("photo.png")).unwrap();
    image::RgbImage::new(40, 20).save(inputs.join("tiny.png")).unwrap();
    let png = std::fs::read(fixtures().join("images/pano_384x192.png")).unwrap();
    std::fs::write(inputs.join("cut.png"), &png[..png.len() / 3]).unwrap();
    let out = dir.path().join("out");
    let o = panorama_cli(&mut z, &inputs, &out, &["--format", "npz,json,png,exr,ply,glb,vis", "--json"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "some inputs fail: {stderr}");
    assert!(stderr.contains("photo.png") && stderr.contains("twice its height"), "{stderr}");
    assert!(stderr.contains("tiny.png") && stderr.contains("too small"), "{stderr}");
    assert!(stderr.contains("cut.png"), "{stderr}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let line: serde_json::Value = serde_json::from_str(stdout.lines().next().expect("one line")).unwrap();
    assert_eq!((line["width"].as_u64(), line["height"].as_u64()), (Some(384), Some(192)));
    for suffix in ["npz", "json", "depth.png", "mask.png", "depth.exr", "points.exr", "ply", "glb", "depth_vis.png"] {
        assert!(out.join(format!("pano.{suffix}")).is_file(), "pano.{suffix}");
    }
    for bad in ["photo", "tiny", "cut"] {
        assert!(!out.join(format!("{bad}.npz")).exists(), "{bad}: nothing written");
    }

    let mut got = Npz::open(&out.join("pano.npz"));
    let depth = got.vec_f32("depth");
    let mask = bools(&got.u8("mask").into_raw_vec_and_offset().0);
    let factor = z.f64("metric_factor").into_raw_vec_and_offset().0[0] as f32;
    let want: Vec<f32> = z.vec_f32("merged").iter().map(|&d| d * factor).collect();
    let want_mask = bools(&z.u8("mask").into_raw_vec_and_offset().0);
    let agree = agreement(&mask, &want_mask);
    let both: Vec<usize> = (0..mask.len()).filter(|&i| mask[i] && want_mask[i]).collect();
    let (g, w): (Vec<f32>, Vec<f32>) = both.iter().map(|&i| (depth[i], want[i])).unzip();
    let (p, rel) = (pcc(&g, &w), median_rel(&g, &w));
    let scale = got.scalar_f32("metric_scale");
    eprintln!("panorama: PCC {p:.7}, median rel {rel:.2e}, mask {agree:.5}, metric scale {scale} vs {factor}");
    assert!(p >= 0.9999 && rel <= 1e-3 && agree >= 0.995, "PCC {p}, median rel {rel}, mask {agree}");
    assert!((scale / factor - 1.0).abs() < 2e-3, "metric scale {scale} vs {factor}");
    // Masked pixels are +inf, as in every moge map; the points are the distance along each
    // pixel's direction, in moge's axes: (x, y, z) = (y, −z, −x) of upstream's.
    assert!((0..mask.len()).all(|i| mask[i] == depth[i].is_finite()));
    let points = got.vec_f32("points");
    let up = z.vec_f32("points_upstream_axes_every_7th");
    let cols = 384usize.div_ceil(7);
    let mut checked = 0;
    for (k, u) in up.chunks(3).enumerate() {
        let i = (k / cols) * 7 * 384 + (k % cols) * 7;
        if !(mask[i] && want_mask[i]) {
            continue;
        }
        let q = &points[3 * i..3 * i + 3];
        let mine = [-q[2], q[0], -q[1]];
        let n = (u[0] * u[0] + u[1] * u[1] + u[2] * u[2]).sqrt();
        for c in 0..3 {
            assert!((mine[c] - u[c]).abs() <= 3e-3 * n, "pixel {i}: {mine:?} vs {u:?}");
        }
        checked += 1;
    }
    assert!(checked > 1000, "{checked} points checked");
}

/// The vertices of upstream's mesh over `keep`: the pixels of the 2x2 blocks whose corners are
/// all kept (`build_mesh_from_map`).
fn mesh_vertices(keep: &[bool], w: usize, h: usize) -> usize {
    let mut used = vec![false; w * h];
    for y in 0..h - 1 {
        for x in 0..w - 1 {
            let tl = y * w + x;
            if keep[tl] && keep[tl + 1] && keep[tl + w] && keep[tl + w + 1] {
                for p in [tl, tl + 1, tl + w, tl + w + 1] {
                    used[p] = true;
                }
            }
        }
    }
    used.iter().filter(|&&u| u).count()
}

#[test]
fn the_mesh_keeps_the_pixels_upstreams_keeps() {
    use panorama::edges::{mesh_mask, mesh_mask_of, DEFAULT_RTOL};
    let mut z = fixture();
    // From upstream's own points (a crop taken as a picture): its edges pixel for pixel.
    let (cw, ch) = (160, 48);
    let points: Vec<[f32; 3]> = z.vec_f32("crop_points").chunks(3).map(|p| [p[0], p[1], p[2]]).collect();
    let keep = mesh_mask_of(&points, &z.vec_f32("crop_distance"), &bools(&z.u8("crop_mask").into_raw_vec_and_offset().0), cw, ch, DEFAULT_RTOL);
    let want = bools(&z.u8("crop_mesh_mask").into_raw_vec_and_offset().0);
    assert_eq!(keep, want, "the crop's mesh pixels differ from upstream's");
    assert!(want.iter().any(|&k| !k) && want.iter().any(|&k| k));

    // The whole map, its points made here: upstream's float32 sines differ from moge's by an ulp
    // here and there, which moves a few pixels (see `panorama::edges::points`).
    let (w, h) = (384, 192);
    let mask = bools(&z.u8("mask").into_raw_vec_and_offset().0);
    let want = bools(&z.u8("mesh_mask").into_raw_vec_and_offset().0);
    let keep = mesh_mask(&z.vec_f32("distance"), &mask, w, h, DEFAULT_RTOL);
    let differ = keep.iter().zip(&want).filter(|(a, b)| a != b).count();
    eprintln!("panorama mesh: {differ} of {} pixels differ from upstream's", w * h);
    assert!(differ <= 10, "{differ} of the mesh's pixels differ from upstream's");

    // Through the command: the ply's vertices are upstream's mesh's, within the maps' agreement.
    let dir = tempfile::tempdir().unwrap();
    let pano = fixtures().join("images/pano_384x192.png");
    let o = panorama_cli(&mut z, &pano, dir.path(), &["--format", "ply"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ply = std::fs::read(dir.path().join("pano_384x192.ply")).unwrap();
    let header = String::from_utf8_lossy(&ply[..ply.len().min(600)]).into_owned();
    let n: usize = header.lines().find_map(|l| l.strip_prefix("element vertex ")).unwrap().parse().unwrap();
    let upstream = mesh_vertices(&want, w, h);
    eprintln!("panorama ply: {n} vertices, upstream's mesh {upstream}");
    assert!((n as f64 / upstream as f64 - 1.0).abs() < 0.01, "{n} vertices vs upstream's {upstream}");
}

#[test]
fn batch_panorama_is_the_panorama_command_with_shards_and_resuming() {
    let mut z = fixture();
    let size = z.i64("view_size").into_raw_vec_and_offset().0[0].to_string();
    let tokens = z.i64("num_tokens").into_raw_vec_and_offset().0[0].to_string();
    let weights = fixtures().join("tiny_normal.pt");
    let dir = tempfile::tempdir().unwrap();
    let inputs = dir.path().join("in");
    std::fs::create_dir_all(inputs.join("sub")).unwrap();
    for name in ["a.png", "sub/b.png"] {
        std::fs::copy(fixtures().join("images/pano_384x192.png"), inputs.join(name)).unwrap();
    }
    let common = ["--weights", weights.to_str().unwrap(), "--precision", "f32", "--num-tokens", &tokens, "--format", "npz,json", "--json"];
    let run = |cmd: &[&str], out: &std::path::Path| {
        let mut args: Vec<&str> = cmd.to_vec();
        args.extend([inputs.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        args.extend(common);
        let o = crate::support::cli::run(&args);
        let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        (o, lines)
    };
    // The same files as `moge panorama`, the tree mirrored.
    let (by_panorama, by_batch) = (dir.path().join("p"), dir.path().join("b"));
    let (o, _) = run(&["panorama", "--view-size", &size], &by_panorama);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (o, lines) = run(&["batch", "--panorama", "--view-size", &size], &by_batch);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(lines.len(), 2);
    let want = moge::outputs::panorama::suffixes(&moge::outputs::OutputOptions {
        formats: vec![moge::outputs::Format::Npz, moge::outputs::Format::Json],
        ..Default::default()
    });
    for rel in ["a", "sub/b"] {
        let line = lines.iter().find(|l| l["input"].as_str().unwrap().ends_with(&format!("{rel}.png"))).unwrap();
        let outputs: Vec<&str> = line["outputs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        let named: Vec<String> = want.iter().map(|s| by_batch.join(format!("{rel}.{s}")).display().to_string()).collect();
        assert_eq!(outputs, named, "the files written are the ones --skip-existing looks for");
        let (a, b) = (std::fs::read(by_panorama.join(format!("{rel}.npz"))).unwrap(), std::fs::read(by_batch.join(format!("{rel}.npz"))).unwrap());
        assert!(a == b, "{rel}: batch --panorama's npz differs from moge panorama's");
    }
    // Resuming: nothing is redone.
    let before = std::fs::metadata(by_batch.join("a.npz")).unwrap().modified().unwrap();
    let (o, lines) = run(&["batch", "--panorama", "--view-size", &size, "--skip-existing"], &by_batch);
    assert!(o.status.success());
    assert!(lines.iter().all(|l| l["status"] == "skipped") && lines.len() == 2, "{lines:?}");
    assert_eq!(std::fs::metadata(by_batch.join("a.npz")).unwrap().modified().unwrap(), before);
    // Shards: each panorama in exactly one.
    let mut seen = Vec::new();
    for shard in ["0/2", "1/2"] {
        let out = dir.path().join(format!("s{}", &shard[..1]));
        let (o, lines) = run(&["batch", "--panorama", "--view-size", &size, "--shard", shard], &out);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        seen.extend(lines.iter().map(|l| l["input"].as_str().unwrap().to_owned()));
    }
    seen.sort();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_ne!(seen[0], seen[1]);
    // What only photos take is refused, with the reason.
    let (o, _) = run(&["batch", "--panorama", "--fit", "pad"], &dir.path().join("x"));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not apply to --panorama"), "{}", String::from_utf8_lossy(&o.stderr));
    let (o, _) = run(&["batch", "--view-size", "128"], &dir.path().join("x"));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--panorama"), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The fixture panorama through the full-size ViT-S (synthetic weights, regenerated here bit for
/// bit) against upstream's steps on the same checkpoint (`tests/make_panorama_fixtures.py
/// --fullsize`): the merged map at metric scale and the mask.
#[test]
fn a_full_size_vit_s_makes_upstreams_panorama() {
    let mut z = Npz::open(&fixtures().join("panorama/vits-normal_384x192.npz"));
    let size = z.i64("view_size").into_raw_vec_and_offset().0[0] as usize;
    let tokens = z.i64("num_tokens").into_raw_vec_and_offset().0[0] as u32;
    let (config, tensors) = crate::support::reference::fullsize_weights("vits-normal");
    let model = moge::Model::build(config, tensors, &moge::model::BuildOptions::default()).unwrap();
    let predictor = moge::Predictor::local(std::sync::Arc::new(model));
    let photo = moge::image_io::load_rgb(&fixtures().join("images/pano_384x192.png"), true).unwrap();
    let plan = moge::Plan { infer: moge::InferOptions { num_tokens: Some(tokens), ..Default::default() }, ..Default::default() };
    let pano = predictor.predict_panorama(&photo, &plan, size).unwrap();
    let p = &pano.prediction;
    let want = z.vec_f32("distance");
    let want_mask = bools(&z.u8("mask").into_raw_vec_and_offset().0);
    let agree = agreement(&p.mask, &want_mask);
    let both: Vec<usize> = (0..want.len()).filter(|&i| p.mask[i] && want_mask[i]).collect();
    let (g, w): (Vec<f32>, Vec<f32>) = both.iter().map(|&i| (pano.distance[i], want[i])).unzip();
    let (r, rel) = (pcc(&g, &w), median_rel(&g, &w));
    let factor = z.f64("metric_factor").into_raw_vec_and_offset().0[0] as f32;
    eprintln!("ViT-S panorama: PCC {r:.7}, median rel {rel:.2e}, mask {agree:.5}, metric scale {} vs {factor}", p.metric_scale);
    assert!(r >= 0.9999 && rel <= 1e-3 && agree >= 0.995, "PCC {r}, median rel {rel}, mask {agree}");
    assert!((p.metric_scale / factor - 1.0).abs() < 2e-3, "metric scale {} vs {factor}", p.metric_scale);
}
