//! Deterministic synthetic MoGe-2 weights: the Rust twin of `tests/synth_weights.py`.
//!
//! Regenerates, bit-for-bit, the weights of the test checkpoints (`tests/fixtures/*.pt`) and of the full-size
//! references (`tests/fixtures/fullsize/*.npz`, seed 7, shaped). The normative rule is the docstring at the top
//! of `tests/synth_weights.py`; summary:
//!
//! * per tensor: `state = fnv1a64(key) ^ seed.wrapping_mul(GOLDEN)`; element `i` (row-major):
//!   `z = splitmix64_finalise(state + (i+1)*GOLDEN)`, `u = ((z >> 40) as i64 - 2^23) as f32 * 2^-23` (exact),
//!   `value = (u * scale) + offset` (two f32 roundings, no FMA);
//! * (scale, offset) by key: ImageNet mean/std constants, zero mask token, `.weight` ndim>=2:
//!   `(sqrt(3/fan_in) as f32, 0)` with fan_in = prod(shape[1..]), `.weight` ndim 1: `(0.1, 1.0)`,
//!   `.bias`/`.gamma`: `(0.1, 0)`, `cls_token`/`pos_embed`: `(0.5, 0)`;
//! * optional in-place geometry edits ([`shape_geometry`]).
//!
//! std only.

use std::collections::HashMap;

pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// A state dict: key -> (shape, row-major f32 values).
pub type StateDict = HashMap<String, (Vec<usize>, Vec<f32>)>;

pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut h = FNV_OFFSET;
    for &b in data {
        h = (h ^ b as u64).wrapping_mul(FNV_PRIME);
    }
    h
}

#[inline]
fn splitmix_u(state: u64, i: u64) -> f32 {
    let mut z = state.wrapping_add((i + 1).wrapping_mul(GOLDEN));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let t = (z >> 40) as i64 - (1i64 << 23);
    (t as f32) * (1.0f32 / 8_388_608.0f32)
}

/// (scale, offset) for a random tensor; panics on a key the rule does not cover.
pub fn scale_offset(key: &str, shape: &[usize]) -> (f32, f32) {
    let ndim = shape.len();
    if key.ends_with(".weight") && ndim >= 2 {
        let fan_in: usize = shape[1..].iter().product();
        return ((3.0f64 / fan_in as f64).sqrt() as f32, 0.0);
    }
    if key.ends_with(".weight") && ndim == 1 {
        return (0.1, 1.0);
    }
    if key.ends_with(".bias") || key.ends_with(".gamma") {
        return (0.1, 0.0);
    }
    if key.ends_with("cls_token") || key.ends_with("pos_embed") {
        return (0.5, 0.0);
    }
    panic!("synth: no rule for key {key:?} with shape {shape:?}");
}

/// Unshaped synthetic values of one tensor (row-major).
pub fn synth_tensor(key: &str, shape: &[usize], seed: u64) -> Vec<f32> {
    let n: usize = shape.iter().product();
    match key {
        "encoder.image_mean" => return IMAGENET_MEAN.to_vec(),
        "encoder.image_std" => return IMAGENET_STD.to_vec(),
        "encoder.backbone.mask_token" => return vec![0.0; n],
        _ => {}
    }
    let (scale, offset) = scale_offset(key, shape);
    let state = fnv1a64(key.as_bytes()) ^ seed.wrapping_mul(GOLDEN);
    (0..n as u64).map(|i| splitmix_u(state, i) * scale + offset).collect()
}

fn get<'a>(w: &'a mut StateDict, key: &str) -> &'a mut (Vec<usize>, Vec<f32>) {
    w.get_mut(key).unwrap_or_else(|| panic!("synth::shape_geometry: missing key {key}"))
}

/// Flat index of [o, i, 0, 0] in a (O, I, kh, kw) tensor.
fn idx_oi(shape: &[usize], o: usize, i: usize) -> usize {
    let k: usize = shape[2..].iter().product();
    (o * shape[1] + i) * k
}

fn scale_all(w: &mut StateDict, key: &str, s: f32) {
    for v in get(w, key).1.iter_mut() {
        *v *= s;
    }
}

/// Rows 0 and 1 of a 1x1 conv weight become the unit rows e0, e1; bias[0..2] = 0.
fn set_unit_rows(w: &mut StateDict, prefix: &str) {
    let (shape, v) = get(w, &format!("{prefix}.weight"));
    let shape = shape.clone();
    for o in 0..2 {
        for i in 0..shape[1] {
            v[idx_oi(&shape, o, i)] = if i == o { 1.0 } else { 0.0 };
        }
    }
    let b = &mut get(w, &format!("{prefix}.bias")).1;
    b[0] = 0.0;
    b[1] = 0.0;
}

fn add_at(w: &mut StateDict, key: &str, o: usize, i: usize, a: f32) {
    let (shape, v) = get(w, key);
    let j = idx_oi(shape, o, i);
    v[j] += a;
}

/// The in-place geometry edits (rule 2 of `tests/synth_weights.py`), applied to a full unshaped state dict.
pub fn shape_geometry(weights: &mut StateDict) {
    let l = weights
        .keys()
        .filter_map(|k| k.strip_prefix("neck.input_blocks."))
        .filter_map(|r| r.split('.').next()?.parse::<usize>().ok())
        .max()
        .expect("synth::shape_geometry: no neck.input_blocks");
    let r = l - 1;

    set_unit_rows(weights, &format!("neck.input_blocks.{l}"));
    scale_all(weights, &format!("neck.resamplers.{r}.1.weight"), 0.01);
    scale_all(weights, &format!("neck.resamplers.{r}.1.bias"), 0.01);

    for h in ["points_head", "normal_head", "mask_head"] {
        if !weights.contains_key(&format!("{h}.input_blocks.{l}.weight")) {
            continue;
        }
        set_unit_rows(weights, &format!("{h}.input_blocks.{l}"));
        scale_all(weights, &format!("{h}.resamplers.{r}.1.weight"), 0.01);
        scale_all(weights, &format!("{h}.resamplers.{r}.1.bias"), 0.01);
    }

    let pw = format!("points_head.output_blocks.{l}.weight");
    if weights.contains_key(&pw) {
        scale_all(weights, &pw, 0.01);
        add_at(weights, &pw, 0, 0, 0.5);
        add_at(weights, &pw, 1, 1, 0.5);
        add_at(weights, &pw, 2, 0, 0.3);
        add_at(weights, &pw, 2, 1, 0.2);
        get(weights, &format!("points_head.output_blocks.{l}.bias")).1.copy_from_slice(&[0.0, 0.0, 1.0]);
    }

    let mw = format!("mask_head.output_blocks.{l}.weight");
    if weights.contains_key(&mw) {
        scale_all(weights, &mw, 0.01);
        add_at(weights, &mw, 0, 0, 20.0);
        get(weights, &format!("mask_head.output_blocks.{l}.bias")).1.copy_from_slice(&[3.0]);
    }

    let k = weights
        .keys()
        .filter(|k| k.ends_with(".weight"))
        .filter_map(|k| k.strip_prefix("scale_head."))
        .filter_map(|r| r.split('.').next()?.parse::<usize>().ok())
        .max();
    if let Some(k) = k {
        scale_all(weights, &format!("scale_head.{k}.weight"), 0.1);
        for v in get(weights, &format!("scale_head.{k}.bias")).1.iter_mut() {
            *v = 0.0;
        }
    }
}

/// Full synthetic state dict for the given keys/shapes (those of `MoGeModel(**config).state_dict()`).
/// `shaped = false` is the "pure_random" variant.
pub fn synth_state_dict(keys_and_shapes: &[(String, Vec<usize>)], seed: u64, shaped: bool) -> StateDict {
    let mut sd: StateDict = keys_and_shapes.iter().map(|(k, s)| (k.clone(), (s.clone(), synth_tensor(k, s, seed)))).collect();
    if shaped {
        shape_geometry(&mut sd);
    }
    sd
}
