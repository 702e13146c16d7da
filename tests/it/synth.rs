//! The Rust synthetic-weight generator (`support/synth.rs`) is bit-identical to `tests/synth_weights.py`:
//! checked against `tests/fixtures/synth_check.json` (written by `tests/make_fixtures.py`).

use serde_json::Value;

use crate::support::paths::fixtures;
use crate::support::synth::{synth_state_dict, synth_tensor};

fn load() -> Value {
    let p = fixtures().join("synth_check.json");
    serde_json::from_str(&std::fs::read_to_string(&p).expect("read synth_check.json")).expect("parse")
}

fn shape_of(v: &Value) -> Vec<usize> {
    v["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect()
}

fn check_entry(e: &Value, values: &[f32]) {
    let key = e["key"].as_str().unwrap();
    let bits: Vec<u32> = e["first_bits"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let firsts: Vec<f32> = e["first"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let got: Vec<u32> = values.iter().take(bits.len()).map(|v| v.to_bits()).collect();
    assert_eq!(got, bits, "{key}: first values differ: got {:?}, want {:?}", &values[..bits.len()], firsts);
    for (g, w) in values.iter().zip(&firsts) {
        assert_eq!(g.to_bits(), w.to_bits(), "{key}: JSON decimal value differs from its bits");
    }
    check_sum(key, e["sum"].as_f64().unwrap(), values);
}

fn check_sum(key: &str, want: f64, values: &[f32]) {
    let sum: f64 = values.iter().map(|&v| v as f64).sum();
    let abs: f64 = values.iter().map(|&v| (v as f64).abs()).sum();
    // numpy sums pairwise, we sum sequentially: allow 1e-6 relative to the sum of magnitudes.
    assert!((sum - want).abs() <= 1e-6 * abs.max(want.abs()) + 1e-30, "{key}: sum {sum} != {want}");
}

#[test]
fn synth_matches_python() {
    let doc = load();
    assert_eq!(doc["config"], "tiny_normal");
    let seed = doc["seed"].as_u64().unwrap();
    let all: Vec<(String, Vec<usize>)> = doc["all"].as_array().unwrap().iter().map(|e| (e["key"].as_str().unwrap().to_string(), shape_of(e))).collect();
    assert!(all.len() > 100);

    let shaped = synth_state_dict(&all, seed, true);
    let raw = synth_state_dict(&all, seed, false);
    assert_eq!(shaped.len(), all.len());

    for e in doc["checks"].as_array().unwrap() {
        let key = e["key"].as_str().unwrap();
        let (shape, values) = &shaped[key];
        assert_eq!(shape, &shape_of(e), "{key}: shape");
        check_entry(e, values);
    }
    for e in doc["checks_unshaped"].as_array().unwrap() {
        let key = e["key"].as_str().unwrap();
        check_entry(e, &raw[key].1);
        // synth_tensor alone == the unshaped state dict entry
        assert_eq!(synth_tensor(key, &shape_of(e), seed), raw[key].1);
    }
    for e in doc["all"].as_array().unwrap() {
        let key = e["key"].as_str().unwrap();
        check_sum(key, e["sum"].as_f64().unwrap(), &shaped[key].1);
    }
    for e in doc["other_seed"].as_array().unwrap() {
        let key = e["key"].as_str().unwrap();
        let s = e["seed"].as_u64().unwrap();
        check_entry(e, &synth_tensor(key, &shape_of(e), s));
    }
}
