//! The comparisons with upstream MoGe-2: scale-free error metrics, the gates a precision must
//! keep, a model's forward and `infer()` outputs against a case file of `tests/make_fixtures.py`,
//! and every stage of a fixture checkpoint against its per-layer reference.

use std::collections::HashMap;

use candle_core::Tensor;
use moge::model::config::ModelConfig;
use moge::{InferOptions, Model};

use super::npz::Npz;
use super::paths::fixtures;
use super::synth::synth_state_dict;
use super::two_step::{forward_maps, postprocess};

pub fn tensor_vec(t: &candle_core::Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Pearson correlation over the pairs where both values are finite.
pub fn pcc(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let pairs: Vec<(f64, f64)> = a.iter().zip(b).filter(|(x, y)| x.is_finite() && y.is_finite()).map(|(&x, &y)| (x as f64, y as f64)).collect();
    let n = pairs.len() as f64;
    let (ma, mb) = pairs.iter().fold((0.0, 0.0), |s, p| (s.0 + p.0 / n, s.1 + p.1 / n));
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in &pairs {
        sab += (x - ma) * (y - mb);
        saa += (x - ma) * (x - ma);
        sbb += (y - mb) * (y - mb);
    }
    if saa == 0.0 && sbb == 0.0 {
        return 1.0;
    }
    sab / (saa.sqrt() * sbb.sqrt())
}

/// max |a − b| / max |b| over finite pairs: a scale-free error for whole tensors.
pub fn rel_to_max(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length");
    let mut num = 0f64;
    let mut den = 0f64;
    for (&x, &y) in a.iter().zip(b) {
        if x.is_finite() && y.is_finite() {
            num = num.max((x as f64 - y as f64).abs());
            den = den.max((y as f64).abs());
        }
    }
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

/// max |a − b| / |b| elementwise over finite pairs with |b| > floor.
pub fn max_rel(a: &[f32], b: &[f32], floor: f64) -> f64 {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.is_finite() && y.is_finite() && (y.abs() as f64) > floor)
        .map(|(&x, &y)| ((x as f64 - y as f64) / y as f64).abs())
        .fold(0.0, f64::max)
}

/// Positions where exactly one side is finite (or they are non-finite differently).
pub fn nonfinite_mismatch(a: &[f32], b: &[f32]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x.is_finite() != y.is_finite() || (x.is_infinite() && y.is_infinite() && x.signum() != y.signum())).count()
}

pub fn assert_close(name: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: length {} vs {}", got.len(), want.len());
    assert_eq!(nonfinite_mismatch(got, want), 0, "{name}: finite/non-finite pattern differs");
    let e = rel_to_max(got, want);
    assert!(e <= tol, "{name}: max|diff|/max|ref| = {e:.3e} > {tol:.1e}");
}

/// What a model's outputs must keep against upstream's (PCC and mask agreement: at least; the
/// errors: at most).
pub struct Gates {
    pub pcc: f64,
    pub depth_max_rel: f64,
    pub mask_agreement: f64,
    pub scalar_rel: f64,
    /// max |diff| / max |ref| for the forward maps; None: judged by PCC alone.
    pub fwd_tol: Option<f64>,
}

/// The engine's gates, f32 against upstream fp32.
pub const STRICT: Gates = Gates { pcc: 0.99999, depth_max_rel: 1e-3, mask_agreement: 0.999, scalar_rel: 1e-4, fwd_tol: Some(1e-4) };
/// What a faster precision must keep: PCC >= 0.9999 on every output, the mask the same on
/// >= 99.5 % of pixels; depth and scalars are reported, with loose sanity bounds.
pub const REDUCED: Gates = Gates { pcc: 0.9999, depth_max_rel: 0.05, mask_agreement: 0.995, scalar_rel: 0.02, fwd_tol: None };

/// Runs `model` on `img` and checks forward maps and infer outputs against a reference npz
/// (keys of `tests/make_fixtures.py` case files). Prints the measured figures.
pub fn check_against_reference(name: &str, model: &Model, z: &mut Npz, img: &image::RgbImage, opts: &InferOptions, well_posed: bool, g: &Gates) {
    let want_u8 = z.u8("image_u8");
    assert_eq!(img.as_raw().as_slice(), want_u8.as_slice().unwrap(), "{name}: decoded pixels differ from cv2");
    let (w, h) = (img.width() as usize, img.height() as usize);

    let tokens = opts.tokens(model.config.num_tokens_range);
    assert_eq!(tokens as i64, z.i64("num_tokens").iter().next().copied().unwrap(), "{name}: num_tokens");
    let prep = model.prepare(img.as_raw(), w, h, tokens);
    let grid = z.i64("grid");
    assert_eq!(prep.grid, (grid[[0]] as usize, grid[[1]] as usize), "{name}: grid");
    let raw = model.forward(&prep).unwrap();

    // forward(): the maps at input size.
    let fwd = forward_maps(&raw, model.config.remap_output, w, h);
    let p = pcc(&fwd.points, &z.vec_f32("fwd_points"));
    assert!(p >= g.pcc, "{name}: fwd points PCC {p}");
    if let Some(tol) = g.fwd_tol {
        assert_close(&format!("{name}: fwd_points"), &fwd.points, &z.vec_f32("fwd_points"), tol);
        if let Some(n) = &fwd.normal {
            assert_close(&format!("{name}: fwd_normal"), n, &z.vec_f32("fwd_normal"), tol);
        }
        if let Some(m) = &fwd.mask {
            assert_close(&format!("{name}: fwd_mask"), m, &z.vec_f32("fwd_mask"), tol);
        }
    } else {
        if let Some(n) = &fwd.normal {
            let pn = pcc(n, &z.vec_f32("fwd_normal"));
            assert!(pn >= g.pcc, "{name}: fwd normal PCC {pn}");
        }
        if let Some(m) = &fwd.mask {
            let pm = pcc(m, &z.vec_f32("fwd_mask"));
            assert!(pm >= g.pcc, "{name}: fwd mask PCC {pm}");
        }
    }
    let ms = fwd.metric_scale.unwrap();
    let want_ms = z.scalar_f32("fwd_metric_scale");
    assert!(((ms - want_ms) / want_ms).abs() as f64 <= g.scalar_rel, "{name}: metric scale {ms} vs {want_ms}");

    // infer(): the final maps.
    let fwd_z: Vec<f32> = fwd.points.chunks_exact(3).map(|p| p[2]).collect();
    let pred = postprocess(fwd, w, h, prep.grid, opts);
    // What the tool runs: the one-pass post-processing, bit for bit the same numbers.
    let fused = model.postprocess(&raw, (w, h, prep.grid), opts);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(bits(&fused.points) == bits(&pred.points) && bits(&fused.depth) == bits(&pred.depth), "{name}: one-pass points/depth differ");
    assert!(fused.mask == pred.mask && fused.normal.as_deref().map(bits) == pred.normal.as_deref().map(bits), "{name}: one-pass mask/normal differ");
    let want_mask = z.u8("mask");
    let agree = pred.mask.iter().zip(want_mask.iter()).filter(|(a, b)| **a == (**b != 0)).count() as f64 / pred.mask.len() as f64;
    let valid = pred.valid_fraction();
    assert!(agree >= g.mask_agreement, "{name}: mask agreement {agree}");
    let mut normal_pcc = f64::NAN;
    if let Some(n) = &pred.normal {
        // Over the pixels both sides call valid, as for depth and points (masked normals are 0,
        // so a flipped mask pixel would otherwise count as a normal error).
        let want_n = z.vec_f32("normal");
        let (a, b): (Vec<f32>, Vec<f32>) = (0..pred.mask.len())
            .filter(|&i| pred.mask[i] && want_mask[[i / w, i % w]] != 0)
            .flat_map(|i| (0..3).map(move |c| 3 * i + c))
            .map(|j| (n[j], want_n[j]))
            .unzip();
        normal_pcc = pcc(&a, &b);
        assert!(normal_pcc >= g.pcc, "{name}: normal PCC {normal_pcc}");
    }
    if !well_posed {
        // Random geometry leaves the focal/shift solve ill-posed: SciPy's early stop (ftol 1e-3)
        // and our converged solve legitimately differ there. The network path is checked above.
        eprintln!("{name}: fwd points PCC {p:.7}, mask agreement {agree:.4} (valid {valid:.3}); geometry not well posed");
        return;
    }
    let (focal, shift) = (z.scalar_f32("focal"), z.scalar_f32("shift"));
    let focal_err = ((pred.focal - focal) / focal).abs() as f64;
    assert!(focal_err <= g.scalar_rel, "{name}: focal {} vs {focal}", pred.focal);
    // The shift is relative to the affine depth it is added to.
    let z_scale = fwd_z.iter().filter(|v| v.is_finite()).fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    let shift_err = (pred.shift - shift).abs() as f64 / z_scale as f64;
    assert!(shift_err <= g.scalar_rel, "{name}: shift {} vs {shift}", pred.shift);
    let want_k = z.vec_f32("intrinsics");
    let got_k: Vec<f32> = pred.intrinsics.iter().flatten().copied().collect();
    let k_err = got_k.iter().zip(&want_k).map(|(a, b)| ((a - b).abs() / b.abs().max(1e-6)) as f64).filter(|e| e.is_finite()).fold(0.0, f64::max);
    assert!(k_err <= g.scalar_rel, "{name}: intrinsics {got_k:?} vs {want_k:?}");

    let want_depth = z.vec_f32("depth");
    let want_points = z.vec_f32("points");
    let pd = pcc(&pred.depth, &want_depth);
    assert!(pd >= g.pcc, "{name}: depth PCC {pd}");
    let pp = pcc(&pred.points, &want_points);
    assert!(pp >= g.pcc, "{name}: points PCC {pp}");
    // Relative depth error where both sides are valid.
    let (a, b): (Vec<f32>, Vec<f32>) = pred.depth.iter().zip(&want_depth).filter(|(a, b)| a.is_finite() && b.is_finite()).map(|(a, b)| (*a, *b)).unzip();
    let mr = max_rel(&a, &b, 0.0);
    assert!(mr <= g.depth_max_rel, "{name}: depth max rel err {mr}");
    eprintln!(
        "{name}: PCC points {pp:.7} depth {pd:.7} normal {normal_pcc:.7}; depth max rel {mr:.2e}; mask agreement {agree:.4} (valid {valid:.3}); \
         focal rel {focal_err:.1e}, shift rel {shift_err:.1e}, intrinsics rel {k_err:.1e}, metric scale rel {:.1e}",
        ((ms - want_ms) / want_ms).abs()
    );
}

/// Runs `f` at each instruction-set level of the CPU kernels below the one they use by default
/// (which the other tests cover), with the model built and run inside: the fallback routes are
/// then checked on any machine, not only on those that need them.
pub fn at_lower_levels(what: &str, f: impl Fn()) {
    use moge::simd::isa;
    for level in isa::levels().filter(|&l| l < isa::max()) {
        let t = std::time::Instant::now();
        isa::with_isa(level, &f);
        eprintln!("{what} at {level}: {:.1} s", t.elapsed().as_secs_f64());
    }
}

pub fn load(name: &str) -> Model {
    Model::load(&fixtures().join(name), &moge::model::BuildOptions::default()).unwrap()
}

/// Per-stage tolerance: max |diff| / max |ref| (fp32 vs fp32 with different summation orders).
const STAGE_TOL: f64 = 1e-4;

pub fn check_stages(ckpt: &str) {
    let model = load(&format!("{ckpt}.pt"));
    let mut z = Npz::open(&fixtures().join(format!("stages/{ckpt}.npz")));
    let image = z.f32("image");
    let (h, w) = (image.shape()[2], image.shape()[3]);
    let num_tokens = z.i64("num_tokens").iter().next().copied().unwrap() as u32;
    let grid = z.i64("grid");
    let prep = model.prepare_float(&image.iter().copied().collect::<Vec<_>>(), w, h, num_tokens);
    assert_eq!(prep.grid, (grid[[0]] as usize, grid[[1]] as usize), "token grid");
    assert_close("vit_input", &prep.input, &z.vec_f32("vit_input"), 1e-6);

    let st = model.forward_intermediates(&prep, None).unwrap();
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

/// A case of `tests/fixtures/cases.json` and its `infer()` options.
pub fn fixture_case(name: &str) -> (serde_json::Value, InferOptions) {
    let all: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("cases.json")).unwrap()).unwrap();
    let c = all["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no case {name}")).clone();
    let opts = InferOptions {
        num_tokens: c["num_tokens"].as_u64().map(|n| n as u32),
        resolution_level: c["resolution_level"].as_u64().unwrap_or(9) as u32,
        fov_x: c["fov_x"].as_f64().map(|f| f as f32),
        force_projection: c["force_projection"].as_bool().unwrap(),
        apply_mask: c["apply_mask"].as_bool().unwrap(),
        point_map: true,
        normal_map: true,
        ..InferOptions::default()
    };
    (c, opts)
}

/// A published full-size architecture (a key of `tests/fixtures/fullsize/configs.json`:
/// `vits-normal`, `vitb-normal`, `vitl-normal`, `vitl`) with the synthetic weights upstream's
/// outputs in `tests/fixtures/fullsize/<variant>.npz` were computed with (seed 7, shaped).
pub fn fullsize_weights(variant: &str) -> (ModelConfig, HashMap<String, Tensor>) {
    let configs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("fullsize/configs.json")).unwrap()).unwrap();
    let config: ModelConfig = serde_json::from_value(configs[variant].clone()).unwrap();
    let shapes = Model::state_dict_shapes(&config).unwrap();
    let tensors =
        synth_state_dict(&shapes, 7, true).into_iter().map(|(k, (shape, v))| (k, Tensor::from_vec(v, shape, &candle_core::Device::Cpu).unwrap())).collect();
    (config, tensors)
}
