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
    merge::median(&mut r)
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
                assert!((g - e).abs() < 2e-3, "view offsets {:?} vs {want_off:?}", got.log_offsets);
            }
            let factor = z.f64("metric_factor").into_raw_vec_and_offset().0[0];
            let a = panorama::assemble(&got, w, h);
            assert!((a.scale as f64 / factor - 1.0).abs() < 2e-3, "scale {} vs {factor}", a.scale);
        }
    }
}
