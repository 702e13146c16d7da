//! The host numerics against PyTorch's float32 kernels (fixtures from `tests/make_fixtures.py`):
//! bicubic position-embedding resize, antialiased and plain bilinear, linspace, legacy nearest.
use moge::geometry::resize::{nearest_axis, resize_bicubic_scaled, resize_bilinear, resize_bilinear_antialias};
use moge::geometry::uv::linspace;
use moge::model::dinov2::POS_GRID;

use crate::support::npz::Npz;
use crate::support::paths::fixtures;
use crate::support::reference::{assert_close, rel_to_max, tensor_vec};

fn numerics() -> Npz {
    Npz::open(&fixtures().join("numerics.npz"))
}

#[test]
fn bicubic_position_embedding_matches_torch() {
    let mut n = numerics();
    let model = moge::Model::load(&fixtures().join("tiny_normal.pt"), &moge::model::BuildOptions::default()).unwrap();
    let channels = n.i64("pos_channels").iter().next().copied().unwrap() as usize;
    for (h, w) in [(30, 40), (52, 69), (37, 49), (46, 26), (37, 37), (5, 7)] {
        let want = n.f32(&format!("pos_{h}x{w}"));
        assert_eq!(want.shape(), &[1, 1 + h * w, channels]);
        let got = model.pos_embed(h, w).unwrap();
        let got = got.narrow(1, 0, channels).unwrap();
        let got = tensor_vec(&got);
        let want: Vec<f32> = want.iter().copied().collect();
        // Float32 bicubic with the fused multiply-adds of torch's compiled kernel: within a few
        // ulp of torch.
        assert_close(&format!("pos_{h}x{w}"), &got, &want, 2e-6);
    }
}

#[test]
fn bicubic_offset_matters() {
    // Guard against the tempting size-based scale (37/h instead of 37/(h+0.1)).
    let src: Vec<f32> = (0..POS_GRID * POS_GRID).map(|i| ((i * 7919) % 1000) as f32 / 1000.0).collect();
    let a = resize_bicubic_scaled(&src, 1, POS_GRID, POS_GRID, 30, 40, 30.1 / 37.0, 40.1 / 37.0);
    let b = resize_bicubic_scaled(&src, 1, POS_GRID, POS_GRID, 30, 40, 30.0 / 37.0, 40.0 / 37.0);
    assert!(rel_to_max(&a, &b) > 1e-2);
}

fn planar(a: &ndarray::ArrayD<f32>) -> (Vec<f32>, usize, usize, usize) {
    let s = a.shape();
    (a.iter().copied().collect(), s[1], s[2], s[3])
}

#[test]
fn antialiased_bilinear_matches_torch() {
    let mut n = numerics();
    let (src, c, h, w) = planar(&n.f32("aa_src"));
    for key in ["aa_down", "aa_up", "aa_mixed"] {
        let want = n.f32(key);
        let (oh, ow) = (want.shape()[2], want.shape()[3]);
        let got = resize_bilinear_antialias(&src, c, h, w, oh, ow);
        assert_close(key, &got, &want.iter().copied().collect::<Vec<_>>(), 1e-6);
    }
}

#[test]
fn plain_bilinear_matches_torch() {
    let mut n = numerics();
    let (src, c, h, w) = planar(&n.f32("bl_src"));
    for key in ["bl_a", "bl_b"] {
        let want = n.f32(key);
        let (oh, ow) = (want.shape()[2], want.shape()[3]);
        let got = resize_bilinear(&src, c, h, w, oh, ow);
        assert_close(key, &got, &want.iter().copied().collect::<Vec<_>>(), 1e-6);
    }
}

#[test]
fn linspace_matches_torch_within_an_ulp_of_its_range() {
    let mut n = numerics();
    for len in [37usize, 49, 784, 1919] {
        let want = n.vec_f32(&format!("lin_{len}"));
        let got = linspace(-0.8, 0.8, len);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // torch's CPU kernel counts the second half of the elements down from the end
            // (end - step * (len - 1 - i)): allow one ulp of the range's magnitude, not of the
            // element's.
            assert!((g - w).abs() <= 0.8 * f32::EPSILON, "lin_{len}[{i}]: {g} vs {w}");
        }
    }
}

#[test]
fn legacy_nearest_matches_torch() {
    let mut n = numerics();
    // The source is an arange, so each output value is its source index.
    let want = n.f32("nn_out");
    let (h, w) = (48usize, 64usize);
    let ys = nearest_axis(h, 64);
    let xs = nearest_axis(w, 64);
    for (i, y) in ys.iter().enumerate() {
        for (j, x) in xs.iter().enumerate() {
            assert_eq!(want[[0, 0, i, j]], (y * w + x) as f32, "({i},{j})");
        }
    }
    let shape = n.i64("nn_big_shape");
    let (bh, bw) = (shape[[0]] as usize, shape[[1]] as usize);
    let want = n.f32("nn_big_out");
    let ys = nearest_axis(bh, 64);
    let xs = nearest_axis(bw, 64);
    for (i, y) in ys.iter().enumerate() {
        for (j, x) in xs.iter().enumerate() {
            assert_eq!(want[[0, 0, i, j]], (y * bw + x) as f32, "big ({i},{j})");
        }
    }
}
