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

/// The decoder's full-resolution level folded at load (`moge::model::modules::FoldedTail`)
/// against the stacks run as upstream writes them, on checkpoints with three heads and with two
/// (`tiny_vitl` has no normal head): f32 the same maps up to rounding; bf16 and int8 as close
/// to f32 as the unfolded model of their precision is. The folded model no longer makes the
/// neck's last map. (By default bf16 folds and f32 does not.)
#[test]
fn the_folded_decoder_matches_the_unfolded_one() {
    use crate::support::reference::{pcc, rel_to_max, tensor_vec};
    use moge::model::{BuildOptions, Precision};
    let img = moge::image_io::load_rgb(&fixtures().join("images/rgb_64x48.png"), true).unwrap();
    for ckpt in ["tiny_normal", "tiny_vitl", "random_normal"] {
        let path = fixtures().join(format!("{ckpt}.pt"));
        let run = |build: &BuildOptions| {
            let model = moge::Model::load(&path, build).unwrap();
            let prep = model.prepare(img.as_raw(), img.width() as usize, img.height() as usize, 300);
            model.forward_intermediates(&prep, None).unwrap()
        };
        let f32_build = BuildOptions::new(&candle_core::Device::Cpu, Precision::F32).unwrap();
        assert!(!f32_build.folds() && BuildOptions::new(&candle_core::Device::Cpu, Precision::Bf16).unwrap().folds(), "the defaults");
        let reference = run(&f32_build);
        for precision in [Precision::F32, Precision::Bf16, Precision::Int8] {
            let build = BuildOptions::new(&candle_core::Device::Cpu, precision).unwrap();
            let (folded, unfolded) = (run(&build.clone().with_fold(true)), run(&build.clone().with_fold(false)));
            assert_eq!(folded.neck.len() + 1, unfolded.neck.len(), "{ckpt}: the folded neck ends a level early");
            assert_eq!(folded.heads.len(), unfolded.heads.len());
            assert!(folded.heads.len() >= 2, "{ckpt}: heads");
            for (((name, a), (_, b)), (_, r)) in folded.heads.iter().zip(&unfolded.heads).zip(&reference.heads) {
                assert_eq!(a.len(), b.len(), "{ckpt} {name}: levels");
                let (a, b, r) = (tensor_vec(a.last().unwrap()), tensor_vec(b.last().unwrap()), tensor_vec(r.last().unwrap()));
                let what = format!("{ckpt} {name} {precision:?}");
                if precision == Precision::F32 {
                    let e = rel_to_max(&a, &b);
                    assert!(e < 1e-5, "{what}: folded vs unfolded max|diff|/max|ref| {e:.2e}");
                } else {
                    let (pf, pu) = (pcc(&a, &r), pcc(&b, &r));
                    eprintln!("{what}: PCC against f32, folded {pf:.7}, unfolded {pu:.7}");
                    let gate = if precision == Precision::Int8 { 0.999 } else { 0.9999 };
                    assert!(pf >= gate && 1.0 - pf <= 2.0 * (1.0 - pu) + 1e-6, "{what}: PCC against f32, folded {pf:.7}, unfolded {pu:.7}");
                }
            }
        }
    }
}
