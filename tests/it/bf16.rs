//! `--precision bf16` against upstream fp32: every output keeps PCC >= 0.9999 and the mask
//! agrees on >= 99.5 % of pixels, on the fixture cases and on the full-size ViT-L.
use moge::model::Precision;
use moge::{InferOptions, Model};

use crate::support::npz::Npz;
use crate::support::paths::fixtures;
use crate::support::reference::{at_lower_levels, check_against_reference, fixture_case, fullsize_weights, REDUCED};

fn case(name: &str, well_posed: bool) {
    let (c, opts) = fixture_case(name);
    let model = Model::load(&fixtures().join(c["checkpoint"].as_str().unwrap()), &moge::model::BuildOptions::new(&moge::Device::Cpu, Precision::Bf16).unwrap())
        .unwrap();
    assert_eq!(model.precision, Precision::Bf16);
    let mut z = Npz::open(&fixtures().join(format!("cases/{name}.npz")));
    let img = moge::image_io::load_rgb(&fixtures().join(c["image"].as_str().unwrap()), true).unwrap();
    check_against_reference(name, &model, &mut z, &img, &opts, well_posed, &REDUCED);
}

#[test]
fn bf16_cases() {
    for (name, wp) in [
        ("n_rgb_1200", true),
        ("n_rgb_3600_fov", true),
        ("n_portrait_1200", true),
        ("n_gray_1369", true),
        ("n_rgb16_1800_fov", true),
        ("l_rgb_1800", true),
        ("l_portrait_3600_fov", true),
        ("r_rgb_1200", false),
        ("f16_rgb_1200", true),
        ("bf16_portrait_1800", true),
    ] {
        case(name, wp);
    }
}

/// `--precision bf16` at the instruction-set levels below this machine's: the emulated bf16
/// products (and, on an AVX512-BF16 CPU, the f32 kernels beside them) keep the same gates.
#[test]
fn bf16_at_lower_levels() {
    at_lower_levels("bf16", || {
        case("n_rgb_1200", true);
        case("l_rgb_1800", true);
    });
}

#[test]
fn bf16_differs_from_f32() {
    // The switch really changes the arithmetic (else the gates above prove nothing).
    let img = moge::image_io::load_rgb(&fixtures().join("images/rgb_64x48.png"), true).unwrap();
    let opts = InferOptions { num_tokens: Some(300), ..Default::default() };
    let a = Model::load(&fixtures().join("tiny_normal.pt"), &moge::model::BuildOptions::default()).unwrap().infer(&img, &opts).unwrap();
    let b = Model::load(&fixtures().join("tiny_normal.pt"), &moge::model::BuildOptions::new(&moge::Device::Cpu, Precision::Bf16).unwrap())
        .unwrap()
        .infer(&img, &opts)
        .unwrap();
    assert_ne!(a.depth, b.depth);
}

#[test]
fn bf16_fullsize_vitl_normal() {
    let (config, tensors) = fullsize_weights("vitl-normal");
    let model = Model::build(config, tensors, &moge::model::BuildOptions::new(&moge::Device::Cpu, Precision::Bf16).unwrap()).unwrap();
    let mut z = Npz::open(&fixtures().join("fullsize/vitl-normal.npz"));
    let img = moge::image_io::load_rgb(&fixtures().join("images/rgb_64x48.png"), true).unwrap();
    check_against_reference("bf16 vitl-normal", &model, &mut z, &img, &InferOptions { num_tokens: Some(1800), ..Default::default() }, true, &REDUCED);
}
