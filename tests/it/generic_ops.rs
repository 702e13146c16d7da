//! The model path for non-CPU devices (candle's generic ops, forced here on the CPU with
//! `MOGE_GENERIC_OPS=1`) against the same upstream fixtures as the CPU kernels. The switch is
//! read once per process, at the first model call: each test runs in a process of its own.

use crate::support::npz::Npz;
use crate::support::own_process::own_process;
use crate::support::paths::fixtures;
use crate::support::reference::{check_against_reference, check_stages, fixture_case, REDUCED};
use crate::support::rng::Rng;

/// `MOGE_GENERIC_OPS=1`, for [`own_process`].
const GENERIC_OPS: [(&str, &str); 1] = [("MOGE_GENERIC_OPS", "1")];

#[test]
fn generic_ops_match_upstream_stages() {
    if !own_process("generic_ops::generic_ops_match_upstream_stages", &GENERIC_OPS) {
        return;
    }
    assert!(!moge::model::cpu::enabled());
    assert_eq!(moge::model::cpu::route(moge::model::Precision::F32).kernels, None, "the route says the kernels are off");
    for ckpt in ["tiny_normal", "tiny_vitl", "random_normal"] {
        check_stages(ckpt);
    }
}

/// The 3x3 convolution a CUDA build without cuDNN runs (nine shifted views, one product)
/// against candle's f32 conv2d: in f32, and in bf16 (its inputs rounded to bf16 for the reference).
#[test]
fn unfolded_conv3x3_matches_conv2d() {
    use candle_core::{DType, Device, Tensor};
    if !own_process("generic_ops::unfolded_conv3x3_matches_conv2d", &GENERIC_OPS) {
        return;
    }
    assert!(!moge::model::cpu::enabled());
    let (cin, cout, h, w) = (5, 7, 6, 9);
    let conv = |weight: &Tensor, bias: &Tensor, dtype| {
        let tensors = [("c.weight".to_string(), weight.clone()), ("c.bias".to_string(), bias.clone())].into();
        let mut ws = moge::model::weights::Weights::new(tensors, &moge::model::BuildOptions::default().with_dtype(dtype).unwrap());
        let conv = moge::model::modules::Conv3x3::load(&mut ws, "c", cin, cout).unwrap();
        ws.finish().unwrap();
        conv
    };
    let mut rng = Rng::new(0xc0ff_ee33);
    let mut random = |shape: &[usize]| {
        let t = Tensor::from_vec(rng.units(shape.iter().product()), shape, &Device::Cpu).unwrap();
        t.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap()
    };
    let weight = random(&[cout, cin, 3, 3]);
    let bias = random(&[cout]);
    let x = random(&[cin, h, w]);
    let reference = conv(&weight, &bias, DType::F32).forward(&x).unwrap();
    assert_eq!(reference.dims(), &[cout, h, w]);
    let scale = reference.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    let f32 = conv(&weight, &bias, DType::F32).forward_unfolded(&x).unwrap();
    let bf16 = conv(&weight, &bias, DType::BF16).forward(&x).unwrap();
    assert_eq!(bf16.dtype(), DType::F32, "activations stay f32 between products");
    assert_ne!(bf16.to_vec3::<f32>().unwrap(), reference.to_vec3::<f32>().unwrap(), "the product is rounded to bf16");
    for (got, tol) in [(f32, 1e-6), (bf16, 1e-2)] {
        let err = (&reference - &got).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(err <= tol * scale, "max error {err} of {scale}");
    }
}

/// What the CUDA device computes with `--precision bf16` (its default): candle's generic ops,
/// every matrix product with bf16 weights and inputs, f32 accumulation, a bf16 result, and f32
/// between products. Run here on the CPU with the same arithmetic (`moge::model::matmul`),
/// against upstream fp32 with the reduced-precision gates.
fn bf16_model(ckpt: &std::path::Path) -> moge::Model {
    let ck = moge::model::checkpoint::Checkpoint::read(ckpt).unwrap();
    let m = moge::Model::build(
        ck.config,
        ck.tensors,
        &moge::model::BuildOptions::new(&moge::Device::Cpu, moge::model::Precision::Bf16).unwrap().with_dtype(candle_core::DType::BF16).unwrap(),
    )
    .unwrap();
    assert_eq!(m.dtype, candle_core::DType::BF16);
    m
}

#[test]
fn bf16_products_match_upstream() {
    if !own_process("generic_ops::bf16_products_match_upstream", &GENERIC_OPS) {
        return;
    }
    assert!(!moge::model::cpu::enabled());
    for (name, wp) in [("n_rgb_1200", true), ("n_portrait_1200", true), ("l_rgb_1800", true), ("r_rgb_1200", false)] {
        let (c, opts) = fixture_case(name);
        let model = bf16_model(&fixtures().join(c["checkpoint"].as_str().unwrap()));
        let mut z = Npz::open(&fixtures().join(format!("cases/{name}.npz")));
        let img = moge::image_io::load_rgb(&fixtures().join(c["image"].as_str().unwrap()), true).unwrap();
        check_against_reference(&format!("bf16 products {name}"), &model, &mut z, &img, &opts, wp, &REDUCED);
    }
    // The dtype really changes the arithmetic (else the gates above prove nothing).
    let img = moge::image_io::load_rgb(&fixtures().join("images/rgb_64x48.png"), true).unwrap();
    let opts = moge::InferOptions { num_tokens: Some(300), ..Default::default() };
    let a = moge::Model::load(&fixtures().join("tiny_normal.pt"), &moge::model::BuildOptions::default()).unwrap().infer(&img, &opts).unwrap();
    let b = bf16_model(&fixtures().join("tiny_normal.pt")).infer(&img, &opts).unwrap();
    assert_ne!(a.depth, b.depth);
}
