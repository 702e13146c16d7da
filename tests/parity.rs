//! Number-for-number parity with upstream MoGe-2 (`tests/make_fixtures.py` made the fixtures
//! with the PyPI reference): every stage of the network, then `infer()`'s final maps.
mod support;

use support::*;


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

fn check_case(name: &str, well_posed: bool) {
    let (c, opts) = fixture_case(name);
    let model = load(c["checkpoint"].as_str().unwrap());
    let mut z = Npz::open(&fixtures().join(format!("cases/{name}.npz")));
    // Decoding: the same 8-bit RGB as cv2.imread + BGR2RGB (checked inside).
    let img = moge::image_io::load_rgb(&fixtures().join(c["image"].as_str().unwrap()), true).unwrap();
    check_against_reference(name, &model, &mut z, &img, &opts, well_posed, &STRICT);
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
    // model.half().state_dict() / model.bfloat16().state_dict(), against upstream's
    // from_pretrained on the same files (the rounded weights in an fp32 model).
    case_f16_checkpoint => "f16_rgb_1200", true;
    case_bf16_checkpoint => "bf16_portrait_1800", true;
}
