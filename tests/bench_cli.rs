//! `moge bench` reports what it measured, with the conditions, in both output forms.
mod support;

use std::process::Command;

use support::fixtures;

#[test]
fn bench_json_reports_stages_conditions_and_memory() {
    let out = Command::new(env!("CARGO_BIN_EXE_moge"))
        .args(["bench", "--runs", "3", "--warmup", "1", "--size", "96x64", "--num-tokens", "200", "--json", "--weights"])
        .arg(fixtures().join("tiny_normal.pt"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["conditions"];
    assert_eq!(c["num_tokens"], 200);
    assert_eq!(c["image_size"], serde_json::json!([96, 64]));
    assert_eq!(c["backbone"], "dinov2_vitt14");
    assert!(c["threads"].as_u64().unwrap() >= 1);
    let per = &v["per_image_s"];
    assert_eq!(per["all"].as_array().unwrap().len(), 3);
    let (min, med, p90) = (per["min"].as_f64().unwrap(), per["median"].as_f64().unwrap(), per["p90"].as_f64().unwrap());
    assert!(0.0 < min && min <= med && med <= p90, "{per}");
    for stage in ["decode", "preprocess", "encoder", "neck", "points_head", "normal_head", "mask_head", "postprocess", "write npz"] {
        assert!(v["stages"][stage]["median_s"].as_f64().unwrap() >= 0.0, "{stage} missing");
    }
    // The stages account for (almost) all of the per-image time.
    let sum: f64 = v["stages"].as_object().unwrap().values().map(|s| s["min_s"].as_f64().unwrap()).sum();
    assert!(sum <= per["all"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).fold(f64::MAX, f64::min) * 1.01 + 1e-3);
    assert!(v["peak_rss_bytes"].as_u64().unwrap() > 1 << 20);
    assert!(v["cold_start_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_table_states_the_conditions() {
    let out = Command::new(env!("CARGO_BIN_EXE_moge"))
        .args(["bench", "--runs", "1", "--warmup", "0", "--size", "64x48", "--num-tokens", "100", "--weights"])
        .arg(fixtures().join("tiny_vitl.pt"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("100 tokens") && s.contains("64x48") && (s.contains(", f32,") || s.contains(", bf16,")) && s.contains("threads"), "{s}");
    assert!(s.contains("median") && s.contains("p90") && s.contains("peak memory"), "{s}");
    assert!(!s.contains("normal_head"), "no normal head in this model: {s}");
}

#[test]
fn host_only_times_each_host_stage_of_the_requested_formats() {
    let run = |formats: &str| -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_moge"))
            .args(["bench", "--host-only", "--runs", "3", "--size", "320x240", "--num-tokens", "200", "--json", "--format", formats, "--weights"])
            .arg(fixtures().join("tiny_normal.pt"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = run("npz,png,json");
    assert_eq!(v["mode"], "host-only");
    assert_eq!(v["image_size"], serde_json::json!([320, 240]));
    assert_eq!(v["formats"], serde_json::json!(["npz", "png", "json"]));
    let st = &v["stages"];
    let med = |s: &str| st[s]["median_ms"].as_f64().unwrap_or_else(|| panic!("{s} missing: {v}"));
    for s in ["decode", "prepare", "postprocess", "write", "host total"] {
        assert!(med(s) > 0.0, "{s}: {v}");
        assert!(st[s]["min_ms"].as_f64().unwrap() <= med(s) && med(s) <= st[s]["p90_ms"].as_f64().unwrap());
    }
    // The total is the stages' sum per round (medians of sums need not add up exactly).
    let min_sum: f64 = ["decode", "prepare", "postprocess", "write"].iter().map(|s| st[*s]["min_ms"].as_f64().unwrap()).sum();
    assert!(st["host total"]["min_ms"].as_f64().unwrap() >= min_sum * 0.999);
    // Writing more formats costs more than writing fewer of the same maps.
    let lone = run("json");
    assert!(lone["stages"]["write"]["min_ms"].as_f64().unwrap() < st["write"]["min_ms"].as_f64().unwrap(), "{lone} vs {v}");
}
