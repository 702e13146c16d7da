//! The published full-size architectures with synthetic weights (regenerated here bit-for-bit
//! by `support/synth.rs`, so no 1.3 GB checkpoint is committed) against upstream's outputs
//! in `tests/fixtures/fullsize/` (made by `tests/make_fullsize_reference.py`), 1800 tokens.
//! ViT-L with normals runs in CI; the other three with `-- --include-ignored`.

use moge::{InferOptions, Model};

use crate::support::npz::Npz;
use crate::support::own_process::own_process;
use crate::support::paths::fixtures;
use crate::support::reference::{check_against_reference, fullsize_weights, REDUCED, STRICT};

fn build(variant: &str) -> Model {
    let (config, tensors) = fullsize_weights(variant);
    Model::build(config, tensors, &moge::model::BuildOptions::default()).unwrap()
}

fn check(variant: &str) {
    let model = build(variant);
    let mut z = Npz::open(&fixtures().join(format!("fullsize/{variant}.npz")));
    let img = moge::image_io::load_rgb(&fixtures().join("images/rgb_64x48.png"), true).unwrap();
    let opts = InferOptions { num_tokens: Some(1800), ..Default::default() };
    check_against_reference(variant, &model, &mut z, &img, &opts, true, &STRICT);
}

#[test]
fn fullsize_vitl_normal_1800_tokens() {
    check("vitl-normal");
}

#[test]
#[ignore = "slow: run with --include-ignored"]
fn fullsize_vits_normal_1800_tokens() {
    check("vits-normal");
}

#[test]
#[ignore = "slow: run with --include-ignored"]
fn fullsize_vitb_normal_1800_tokens() {
    check("vitb-normal");
}

#[test]
#[ignore = "slow: run with --include-ignored"]
fn fullsize_vitl_1800_tokens() {
    check("vitl");
}

/// ViT-L with the CUDA device's default arithmetic (candle's generic ops with bf16 products,
/// here on the CPU, in a process of its own with `MOGE_GENERIC_OPS=1`) against upstream fp32:
/// 24 blocks of bf16 products keep the reduced-precision gates.
#[test]
#[ignore = "slow: run with --include-ignored"]
fn fullsize_vitl_normal_bf16_products() {
    if !own_process("fullsize::fullsize_vitl_normal_bf16_products", &[("MOGE_GENERIC_OPS", "1")]) {
        return;
    }
    assert!(!moge::model::cpu::enabled());
    let (config, tensors) = fullsize_weights("vitl-normal");
    let model = Model::build(
        config,
        tensors,
        &moge::model::BuildOptions::new(&moge::Device::Cpu, moge::model::Precision::Bf16).unwrap().with_dtype(candle_core::DType::BF16).unwrap(),
    )
    .unwrap();
    let mut z = Npz::open(&fixtures().join("fullsize/vitl-normal.npz"));
    let img = moge::image_io::load_rgb(&fixtures().join("images/rgb_64x48.png"), true).unwrap();
    let opts = InferOptions { num_tokens: Some(1800), ..Default::default() };
    check_against_reference("bf16 products vitl-normal", &model, &mut z, &img, &opts, true, &REDUCED);
}
