//! Number-for-number parity with upstream MoGe-2 (`tests/make_fixtures.py` made the fixtures
//! with the PyPI reference): every stage of the network, then `infer()`'s final maps.
use crate::support::npz::Npz;
use crate::support::paths::fixtures;
use crate::support::reference::{at_lower_levels, check_against_reference, check_stages, fixture_case, load, STRICT};

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

/// The fallback routes of the CPU kernels (every instruction-set level below this machine's,
/// e.g. im2col convolutions and the baseline softmax on an AVX-512 CPU) against the same
/// fixtures and gates: every stage of the three checkpoints, and two cases end to end.
#[test]
fn lower_isa_levels() {
    use moge::model::{cpu, Precision};
    use moge::simd::{isa, sgemm};
    let img = moge::image_io::load_rgb(&fixtures().join("images/rgb_64x48.png"), true).unwrap();
    let opts = moge::InferOptions { num_tokens: Some(300), ..Default::default() };
    let depth = || load("tiny_normal.pt").infer(&img, &opts).unwrap().depth;
    let (default_route, default_depth) = (cpu::route(Precision::F32), depth());
    at_lower_levels("parity", || {
        for ckpt in ["tiny_normal", "tiny_vitl", "random_normal"] {
            check_stages(ckpt);
        }
        check_case("n_rgb_1200", true);
        check_case("l_portrait_3600_fov", true);
        // The level reaches the model (else the checks above prove nothing new): another route
        // sums in another order, so gives other bits; except the one-tap kernels of AVX2 and
        // AVX-512, which sum every output in the same order (the inner index ascending, in the
        // same slices) and so give the same bits, a property of its own.
        let one_tap = |level| sgemm::Micro::at(level).is_some();
        if one_tap(isa::current()) && one_tap(isa::max()) {
            assert!(depth() == default_depth, "{}: the one-tap kernels' bits differ from {}", isa::current(), isa::max());
        } else if cpu::route(Precision::F32).kernels != default_route.kernels {
            assert_ne!(depth(), default_depth, "another route, the same bits");
        }
    });
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
