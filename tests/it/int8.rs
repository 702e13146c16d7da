//! `--precision int8` against upstream fp32: points PCC >= 0.999 (every output), the mask the
//! same on >= 99.5 % of pixels, the field of view within 2 % (`INT8` gates), on the fixture
//! cases, the full-size ViT-S, and at every instruction-set level (the VNNI routes and the
//! emulated one).
use moge::model::Precision;
use moge::{InferOptions, Model};

use crate::support::cli::moge;
use crate::support::npz::Npz;
use crate::support::paths::fixtures;
use crate::support::reference::{at_lower_levels, check_against_reference, fixture_case, fullsize_weights, Gates};

const INT8: Gates = Gates { pcc: 0.999, depth_max_rel: 0.05, mask_agreement: 0.995, scalar_rel: 0.02, fwd_tol: None };

fn case(name: &str, well_posed: bool) {
    let (c, opts) = fixture_case(name);
    let model = Model::load(&fixtures().join(c["checkpoint"].as_str().unwrap()), &moge::model::BuildOptions::new(&moge::Device::Cpu, Precision::Int8).unwrap())
        .unwrap();
    assert_eq!(model.precision, Precision::Int8);
    let mut z = Npz::open(&fixtures().join(format!("cases/{name}.npz")));
    let img = moge::image_io::load_rgb(&fixtures().join(c["image"].as_str().unwrap()), true).unwrap();
    check_against_reference(name, &model, &mut z, &img, &opts, well_posed, &INT8);
}

#[test]
fn int8_cases() {
    for (name, wp) in
        [("n_rgb_1200", true), ("n_rgb_3600_fov", true), ("n_portrait_1200", true), ("l_rgb_1800", true), ("l_portrait_3600_fov", true), ("r_rgb_1200", false)]
    {
        case(name, wp);
    }
}

/// The lower levels take the other routes: AVX-VNNI at avx2 where the CPU has it, the emulated
/// route at portable.
#[test]
fn int8_at_lower_levels() {
    at_lower_levels("int8", || {
        case("n_rgb_1200", true);
        case("l_rgb_1800", true);
    });
}

#[test]
fn int8_differs_from_f32_and_from_bf16() {
    // The switch really changes the arithmetic (else the gates above prove nothing).
    let img = moge::image_io::load_rgb(&fixtures().join("images/rgb_64x48.png"), true).unwrap();
    let opts = InferOptions { num_tokens: Some(300), ..Default::default() };
    let run = |p| {
        Model::load(&fixtures().join("tiny_normal.pt"), &moge::model::BuildOptions::new(&moge::Device::Cpu, p).unwrap())
            .unwrap()
            .infer(&img, &opts)
            .unwrap()
            .depth
    };
    let (f32, int8, bf16) = (run(Precision::F32), run(Precision::Int8), run(Precision::Bf16));
    assert_ne!(f32, int8);
    assert_ne!(bf16, int8);
}

#[test]
fn int8_fullsize_vits_normal() {
    let (config, tensors) = fullsize_weights("vits-normal");
    let model = Model::build(config, tensors, &moge::model::BuildOptions::new(&moge::Device::Cpu, Precision::Int8).unwrap()).unwrap();
    let mut z = Npz::open(&fixtures().join("fullsize/vits-normal.npz"));
    let img = moge::image_io::load_rgb(&fixtures().join("images/rgb_64x48.png"), true).unwrap();
    check_against_reference("int8 vits-normal", &model, &mut z, &img, &InferOptions { num_tokens: Some(1800), ..Default::default() }, true, &INT8);
}

/// Without the CPU kernels (`MOGE_GENERIC_OPS=1`) int8 cannot run: refused before the model
/// loads, rather than run in f32 under int8's name.
#[test]
fn int8_without_the_cpu_kernels_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let photo = fixtures().join("images/rgb_64x48.png");
    let weights = fixtures().join("tiny_normal.pt");
    let o = moge()
        .env("MOGE_GENERIC_OPS", "1")
        .args(["predict", photo.to_str().unwrap(), "-o", dir.path().to_str().unwrap(), "--weights", weights.to_str().unwrap(), "--precision", "int8"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("--precision int8 needs the CPU kernels: unset MOGE_GENERIC_OPS"), "{e}");
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "nothing written");
}
