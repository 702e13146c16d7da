//! Number-for-number parity with upstream MoGe-2 (`tests/make_fixtures.py` made the fixtures
//! with the PyPI reference): every stage of the network, then `infer()`'s final maps.
mod support;

use moge::{InferOptions, Model};
use serde_json::Value;
use support::*;

fn load(name: &str) -> Model {
    Model::load(&fixtures().join(name), &moge::Device::Cpu).unwrap()
}

/// Per-stage tolerance: max |diff| / max |ref| (fp32 vs fp32 with different summation orders).
const STAGE_TOL: f64 = 1e-4;

fn check_stages(ckpt: &str) {
    let model = load(&format!("{ckpt}.pt"));
    let mut z = Npz::open(&fixtures().join(format!("stages/{ckpt}.npz")));
    let image = z.f32("image");
    let (h, w) = (image.shape()[2], image.shape()[3]);
    let num_tokens = z.i64("num_tokens").iter().next().copied().unwrap() as u32;
    let grid = z.i64("grid");
    let prep = model.prepare_float(&image.iter().copied().collect::<Vec<_>>(), w, h, num_tokens);
    assert_eq!(prep.grid, (grid[[0]] as usize, grid[[1]] as usize), "token grid");
    assert_close("vit_input", &prep.input, &z.vec_f32("vit_input"), 1e-6);

    let st = model.forward_stages(&prep, None).unwrap();
    assert_close("pos_embed", &tensor_vec(&st.pos_embed), &z.vec_f32("pos_embed"), 1e-6);
    let taps = z.i64("intermediate_layers");
    assert_eq!(st.taps.len(), taps.len());
    for (t, k) in st.taps.iter().zip(taps.iter()) {
        assert_close(&format!("tap_{k}"), &tensor_vec(t), &z.vec_f32(&format!("tap_{k}")), STAGE_TOL);
    }
    assert_close("features", &tensor_vec(&st.features), &z.vec_f32("features"), STAGE_TOL);
    assert_close("cls_token", &tensor_vec(&st.cls_token), &z.vec_f32("cls_token"), STAGE_TOL);
    for (i, t) in st.neck.iter().enumerate() {
        assert_close(&format!("neck_{i}"), &tensor_vec(t), &z.vec_f32(&format!("neck_{i}")), STAGE_TOL);
    }
    for (name, levels) in &st.heads {
        for (i, t) in levels.iter().enumerate() {
            let key = format!("{name}_{i}");
            assert_close(&key, &tensor_vec(t), &z.vec_f32(&key), STAGE_TOL);
        }
    }
    if z.has("metric_scale_raw") {
        let want = z.scalar_f32("metric_scale_raw");
        let got = st.raw.metric_scale.unwrap();
        assert!(((got - want) / want).abs() < 1e-5, "metric_scale_raw {got} vs {want}");
    }
}

#[test]
fn stages_tiny_normal() {
    check_stages("tiny_normal");
}
#[test]
fn stages_tiny_vitl() {
    check_stages("tiny_vitl");
}
#[test]
fn stages_random_normal() {
    check_stages("random_normal");
}

fn case(name: &str) -> Value {
    let all: Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("cases.json")).unwrap()).unwrap();
    all["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no case {name}")).clone()
}

fn check_case(name: &str, well_posed: bool) {
    let c = case(name);
    let model = load(c["checkpoint"].as_str().unwrap());
    let mut z = Npz::open(&fixtures().join(format!("cases/{name}.npz")));
    // Decoding: the same 8-bit RGB as cv2.imread + BGR2RGB.
    let img = moge::image_io::load_rgb(&fixtures().join(c["image"].as_str().unwrap()), true).unwrap();
    let opts = InferOptions {
        num_tokens: c["num_tokens"].as_u64().map(|n| n as u32),
        resolution_level: c["resolution_level"].as_u64().unwrap_or(9) as u32,
        fov_x: c["fov_x"].as_f64().map(|f| f as f32),
        force_projection: c["force_projection"].as_bool().unwrap(),
        apply_mask: c["apply_mask"].as_bool().unwrap(),
    };
    check_against_reference(name, &model, &mut z, &img, &opts, well_posed);
}

macro_rules! cases {
    ($($fn:ident => $name:literal, $wp:expr;)*) => { $( #[test] fn $fn() { check_case($name, $wp); } )* };
}

cases! {
    case_n_rgb_1200 => "n_rgb_1200", true;
    case_n_rgb_3600_fov => "n_rgb_3600_fov", true;
    case_n_portrait_1200 => "n_portrait_1200", true;
    case_n_gray_1369 => "n_gray_1369", true;
    case_n_rgba_level0 => "n_rgba_level0", true;
    case_n_rgb16_1800_fov => "n_rgb16_1800_fov", true;
    case_n_tiny8_1200 => "n_tiny8_1200", true;
    case_n_rgb_noproj_nomask => "n_rgb_noproj_nomask", true;
    case_l_rgb_1800 => "l_rgb_1800", true;
    case_l_portrait_3600_fov => "l_portrait_3600_fov", true;
    case_r_rgb_1200 => "r_rgb_1200", false;
}
