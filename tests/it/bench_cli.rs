//! `moge bench` reports what it measured, with the conditions, in both output forms.
use std::process::Command;

use crate::support::cli::moge;
use crate::support::paths::{fixtures, repo};

#[test]
fn bench_json_reports_stages_conditions_and_memory() {
    let out = moge()
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
    // The CPU kernels' route, as the library describes it for this process's environment.
    let precision = if c["precision"] == "bf16" { moge::model::Precision::Bf16 } else { moge::model::Precision::F32 };
    let route = serde_json::to_value(moge::model::cpu::route(precision)).unwrap();
    assert_eq!(c["cpu_route"], route, "{c}");
    assert_eq!(c["cpu_route"]["isa"], moge::simd::isa::max().name());
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
    // On the CPU the model call is the network's stages.
    let call = v["model_call_s"]["median"].as_f64().unwrap();
    assert!(call > 0.0 && call < per["median"].as_f64().unwrap(), "{v}");
    // The device it ran on; `auto` took the CPU here (this build, or no GPU), saying why where it had a choice.
    assert_eq!(c["device"], if cfg!(feature = "cuda") && c["gpu"].is_string() { "cuda:0" } else { "cpu" });
    if !cfg!(feature = "cuda") {
        assert!(c["cpu_because"].as_str().unwrap().contains("built without CUDA"), "{c}");
    }
}

#[test]
fn bench_table_states_the_conditions() {
    let out = moge()
        .args(["bench", "--runs", "1", "--warmup", "0", "--size", "64x48", "--num-tokens", "100", "--weights"])
        .arg(fixtures().join("tiny_vitl.pt"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("100 tokens") && s.contains("64x48") && (s.contains(", f32,") || s.contains(", bf16,")) && s.contains("threads"), "{s}");
    assert!(s.contains("median") && s.contains("p90") && s.contains("peak memory"), "{s}");
    assert!(s.contains("\ncpu route: ") && s.contains("\ncpu kernels: "), "{s}");
    assert!(!s.contains("normal_head"), "no normal head in this model: {s}");
}

#[test]
fn host_only_times_each_host_stage_of_the_requested_formats() {
    let run = |formats: &str| -> serde_json::Value {
        let out = moge()
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

/// `--device cuda` where it cannot be had: exit 2, one line naming what is missing, no panic,
/// on every command that runs the model; `--device cpu` works everywhere.
#[test]
fn device_cuda_without_a_gpu_is_one_clear_line() {
    let probe = moge().args(["info"]).output().unwrap();
    let info = String::from_utf8_lossy(&probe.stdout).into_owned();
    let line = info.lines().find(|l| l.starts_with("device (--device auto): ")).unwrap_or_else(|| panic!("{info}"));
    if line.contains("cuda:") {
        eprintln!("skipped: this machine has a usable GPU ({line})");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The commands' own temporary folder, to see that a failed bench leaves no scratch behind.
    let tmp = tempfile::tempdir().unwrap();
    let img = fixtures().join("images/rgb_64x48.png");
    let w = fixtures().join("tiny_normal.pt");
    let o = dir.path().join("o");
    let images = fixtures().join("images");
    let runs: [Vec<&std::ffi::OsStr>; 3] = [
        vec!["predict".as_ref(), img.as_os_str(), "-o".as_ref(), o.as_os_str()],
        vec!["batch".as_ref(), images.as_os_str(), "-o".as_ref(), o.as_os_str()],
        vec!["bench".as_ref(), "--runs".as_ref(), "1".as_ref()],
    ];
    for args in runs {
        for dev in ["cuda", "cuda:1"] {
            let out =
                moge().env("TMPDIR", tmp.path()).args(&args).args(["--weights".as_ref(), w.as_os_str(), "--device".as_ref(), dev.as_ref()]).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?} {dev}: {err}");
            assert_eq!(err.lines().count(), 1, "{args:?} {dev}: {err}");
            assert!(!err.contains("panicked"), "{err}");
            let why = if cfg!(feature = "cuda") {
                ["no NVIDIA driver", "libcublas", "libcurand", "libnvrtc", "no CUDA GPU"].to_vec()
            } else {
                vec!["built without CUDA"]
            };
            assert!(
                err.starts_with(&format!("moge: --device {}: ", if dev == "cuda" { "cuda:0" } else { dev })) && why.iter().any(|w| err.contains(w)),
                "{err}"
            );
        }
    }
    // Nothing is written (batch checks that its output folder can be made before it loads), and
    // bench's scratch folder is gone although it failed after making it.
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
    assert!(!o.exists() || std::fs::read_dir(&o).unwrap().next().is_none(), "nothing is written when the device cannot be opened");
    // The sidecar names the device the network ran on.
    let out = moge()
        .args([
            "predict".as_ref(),
            img.as_os_str(),
            "--format".as_ref(),
            "json".as_ref(),
            "--device".as_ref(),
            "cpu".as_ref(),
            "--weights".as_ref(),
            w.as_os_str(),
            "-o".as_ref(),
            o.as_os_str(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(o.join("rgb_64x48.json")).unwrap()).unwrap();
    assert_eq!(j["inference"]["device"], "cpu");
}

/// `scripts/gpu-check.sh --dry-run`: every step of the GPU check that a CPU machine can run
/// (parity comparison, bench, batch; with a Python that has torch and dlr-moge, also the
/// synthetic full-size checkpoint and the upstream timings).
#[test]
fn gpu_check_dry_run() {
    let root = repo();
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: no python3 on this machine");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(root.join("scripts/gpu-check.sh"))
        .args(["--dry-run", "--moge", env!("CARGO_BIN_EXE_moge")])
        .env("MOGE_GPU_CHECK_WORK", work.path())
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    let recs: Vec<serde_json::Value> =
        std::fs::read_to_string(work.path().join("results.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let of = |step: &str| recs.iter().filter(|r| r["step"] == step).collect::<Vec<_>>();
    let parity = of("parity");
    assert_eq!(parity.len(), 2, "{text}");
    for p in &parity {
        // The verdict is the gates applied to the figures.
        let pccs: Vec<f64> = ["pcc_points", "pcc_depth", "pcc_normal"].iter().map(|k| p[k].as_f64().unwrap()).collect();
        assert!(pccs.iter().all(|&v| v > 0.999), "{p}");
        let mask = p["mask_agreement"].as_f64().unwrap();
        assert_eq!(p["pass"], pccs.iter().all(|&v| v >= 0.9999) && mask >= 0.995, "{p}");
    }
    // f32 on the CPU against f32 on the CPU is the same arithmetic; bf16 is not.
    let f32 = parity.iter().find(|p| p["label"].as_str().unwrap().contains(" f32 vs")).unwrap();
    assert_eq!((f32["pcc_depth"].as_f64().unwrap(), &f32["pass"]), (1.0, &serde_json::json!(true)), "{f32}");
    let bf16 = parity.iter().find(|p| p["label"].as_str().unwrap().contains(" bf16 vs")).unwrap();
    assert!(bf16["pcc_depth"].as_f64().unwrap() < 1.0, "{bf16}");
    let bench = of("moge-bench");
    assert_eq!(bench.len(), 2, "{text}");
    assert!(bench.iter().all(|b| b["forward_ms"].as_f64().unwrap() > 0.0 && b["model_call_ms"].as_f64().unwrap() > 0.0 && b["device"] == "cpu"), "{text}");
    let batch = of("moge-batch");
    assert_eq!(batch.len(), 2, "{text}");
    assert_eq!(batch[0]["images"], "4", "{text}");
    let passed = parity.iter().filter(|p| p["pass"] == true).count();
    assert!(text.contains("== gpu-check summary ==") && text.contains(&format!("parity: {passed} passed, {} failed", 2 - passed)), "{text}");
    let torch = of("torch");
    if torch.is_empty() {
        let why = of("skip").iter().find(|s| s["what"] == "upstream checkpoints and timings").map(|s| s["why"].to_string());
        eprintln!("upstream part skipped: {}", why.expect("a skipped upstream part says why"));
    } else {
        // The upstream model on the synthetic ViT-S: eager fp32 and bf16 autocast timed.
        assert_eq!(of("checkpoint").len(), 1, "{text}");
        assert_eq!(torch.len(), 2, "{text}");
        assert!(torch.iter().all(|t| t.get("error").is_none() && t["forward_ms"].as_f64().unwrap() > 0.0), "{text}");
    }
}

/// A CUDA build on machines whose CUDA set-up is broken in each way cudarc would panic on,
/// imitated with stub libraries: every case is one line and exit 2 for `--device cuda`, and
/// the CPU for `--device auto`, never a panic.
#[cfg(feature = "cuda")]
#[test]
fn cuda_build_survives_broken_cuda_setups() {
    let dir = tempfile::tempdir().unwrap();
    let stub = |name: &str, code: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        let c = d.join("stub.c");
        std::fs::write(&c, code).unwrap();
        for lib in ["cuda", "cublas", "cublasLt", "curand", "nvrtc"] {
            if lib != "cuda" && name == "driver-only" {
                continue;
            }
            let body = if lib == "cuda" { code } else { "int unused(void) { return 0; }" };
            std::fs::write(&c, body).unwrap();
            let st = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(d.join(format!("lib{lib}.so"))).arg(&c).status();
            if !st.map(|s| s.success()).unwrap_or(false) {
                return None;
            }
        }
        Some(d)
    };
    let no_device = "int cuInit(unsigned f) { return 100; }"; // CUDA_ERROR_NO_DEVICE
    let zero_gpus = "int cuInit(unsigned f) { return 0; } int cuDeviceGetCount(int *n) { *n = 0; return 0; }";
    let no_symbols = "int unrelated(void) { return 0; }";
    let cases = [
        ("driver-only", no_device, "libcublas could not be loaded"),
        ("no-device", no_device, "no CUDA GPU: the driver reports none"),
        ("zero-gpus", zero_gpus, "no CUDA GPU: the driver reports none"),
        ("no-symbols", no_symbols, "the CUDA device could not be opened: "),
    ];
    let img = fixtures().join("images/rgb_64x48.png");
    for (name, code, want) in cases {
        let Some(libs) = stub(name, code) else {
            eprintln!("skipped: no C compiler to build the stub libraries");
            return;
        };
        let run = |dev: &str| {
            moge()
                .args(["predict".as_ref(), img.as_os_str(), "--weights".as_ref(), fixtures().join("tiny_normal.pt").as_os_str()])
                .args(["--device", dev, "-o"])
                .arg(dir.path().join(format!("out-{name}-{dev}")))
                .env("LD_LIBRARY_PATH", &libs)
                .output()
                .unwrap()
        };
        let out = run("cuda");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(err.contains(want) && !err.contains("panicked"), "{name}: {err}");
        let out = run("auto");
        assert!(out.status.success() && out.stderr.is_empty(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// `bench --host-only` times each round's outputs written under new names, as a batch writes
/// them (replacing a file costs its removal, and on ext4 a flush to disk): the rounds' files go
/// to folders of their own that are removed afterwards, and what the output folder held before
/// is left as it was.
#[test]
fn host_only_rounds_write_new_files_and_leave_nothing() {
    use moge::fit;
    use moge::pipeline::{inputs, run};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    // A file where a round would write if it wrote into the folder itself.
    let img = fixtures().join("images/rgb_64x48.png");
    let stem = img.file_stem().unwrap().to_string_lossy().into_owned();
    let kept = out.join(format!("{stem}.npz"));
    std::fs::write(&kept, b"not replaced").unwrap();
    let weights = fixtures().join("tiny_normal.pt");
    let model = moge::Model::load(&weights, &moge::model::BuildOptions::new(&moge::Device::Cpu, moge::model::Precision::F32).unwrap()).unwrap();
    let cfg = run::Config {
        outputs: moge::outputs::OutputOptions { formats: vec![moge::outputs::Format::Npz, moge::outputs::Format::Png], ..Default::default() },
        plan: moge::Plan {
            infer: moge::InferOptions { num_tokens: Some(200), ..Default::default() },
            canvas: fit::Canvas { width: 64, height: 48 },
            ..Default::default()
        },
        jobs: 1,
        model_id: "tiny".into(),
        weights,
        in_flight: 1,
        ..run::Config::new(out.clone())
    };
    let t = moge::pipeline::host_only::host_only(std::sync::Arc::new(model), &cfg, &inputs::file_input(&img), 1, 3).unwrap();
    assert_eq!(t.len(), 3);
    assert!(t.iter().all(|t| t.write.is_some_and(|w| w > 0.0)), "{t:?}");
    let left: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from(format!("{stem}.npz"))]);
    assert_eq!(std::fs::read(&kept).unwrap(), b"not replaced");
}

/// MoGe-3: each refine step's time, share of the model call, voxels and work, in both forms;
/// none for MoGe-2.
#[test]
fn bench_reports_each_refine_step() {
    let weights = fixtures().join("moge3").join("tiny_moge3.pt");
    let bench = |extra: &[&str]| {
        let out = moge()
            .args(["bench", "--runs", "2", "--warmup", "0", "--size", "64x48", "--num-tokens", "100", "--refine-steps", "2"])
            .args(extra)
            .arg("--weights")
            .arg(&weights)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let v: serde_json::Value = serde_json::from_str(&bench(&["--json"])).unwrap();
    assert_eq!(v["conditions"]["refine_steps"], 2);
    let steps = v["refiner_steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{v}");
    let call = v["model_call_s"]["median"].as_f64().unwrap();
    let mut sum = 0.0;
    for s in steps {
        let (t, share) = (s["median_s"].as_f64().unwrap(), s["share_of_model_call"].as_f64().unwrap());
        assert!(t > 0.0 && (share - t / call).abs() < 1e-9 && share < 1.0, "{s}");
        sum += t;
        let voxels: Vec<u64> = s["voxels_per_level"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        // One voxel per pixel of the head map, fewer at each level down.
        assert_eq!(voxels.len(), 5, "{s}");
        assert!(voxels[0] > 0 && voxels.windows(2).all(|w| w[1] <= w[0]), "{s}");
        let (gmac, conv) = (s["gmac"].as_f64().unwrap(), s["conv_gmac"].as_f64().unwrap());
        assert!(0.0 < conv && conv < gmac, "{s}");
    }
    assert!(sum < call, "the steps ({sum} s) are part of the model call ({call} s)");
    assert!(v["stages"]["refiner"]["median_s"].as_f64().unwrap() > 0.0, "{v}");
    let table = bench(&[]);
    for line in ["refine step 1: median", "refine step 2: median"] {
        let l = table.lines().find(|l| l.starts_with(line)).unwrap_or_else(|| panic!("no '{line}' in {table}"));
        assert!(l.contains("% of the model call") && l.contains("voxels at full resolution") && l.contains("GMAC/s"), "{l}");
    }
    assert!(!table.contains("refine step 3"), "{table}");
    // MoGe-2: no refine steps.
    let out = moge()
        .args(["bench", "--runs", "1", "--warmup", "0", "--size", "64x48", "--num-tokens", "100", "--json", "--weights"])
        .arg(fixtures().join("tiny_vitl.pt"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["conditions"]["refine_steps"].as_u64(), v["refiner_steps"].as_array().map(Vec::len)), (Some(0), Some(0)), "{v}");
}
