//! `moge bench`: cold start, warm per-image time (median, p90, min over N runs), a breakdown by
//! stage and peak memory, with the conditions stated beside every number.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;

use super::{InferArgs, ModelArgs, OutputArgs, EXIT_OK};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// An image file to time (default: a synthetic photo-like JPEG of --size).
    #[arg(value_name = "IMAGE")]
    pub input: Option<PathBuf>,
    /// Size of the synthetic image, WxH.
    #[arg(long, default_value = "640x480", value_parser = parse_size)]
    pub size: (u32, u32),
    /// Timed runs after the warm-up.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Untimed warm-up runs.
    #[arg(long, default_value_t = 1)]
    pub warmup: u32,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub infer: InferArgs,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Time only the host stages (decode, prepare, postprocess, write --format) with one
    /// forward's output reused: what the host costs per image next to a fast device.
    #[arg(long)]
    pub host_only: bool,
    #[command(flatten)]
    pub out: OutputArgs,
}

pub fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let (w, h) = s.split_once(['x', 'X']).ok_or_else(|| format!("'{s}' is not WxH"))?;
    let w: u32 = w.parse().map_err(|_| format!("'{s}' is not WxH"))?;
    let h: u32 = h.parse().map_err(|_| format!("'{s}' is not WxH"))?;
    if !moge::image_io::is_supported_size(w, h) {
        return Err(format!("{w}x{h} is outside the supported image sizes"));
    }
    Ok((w, h))
}

/// A smooth, textured test picture (so JPEG decoding and resizing do real work).
fn synthetic(w: u32, h: u32) -> image::RgbImage {
    image::RgbImage::from_fn(w, h, |x, y| {
        let (fx, fy) = (x as f32 / w as f32, y as f32 / h as f32);
        let n = ((x.wrapping_mul(73_856_093) ^ y.wrapping_mul(19_349_663)) % 32) as f32;
        image::Rgb([(200.0 * fx + n) as u8, (180.0 * fy + n) as u8, (120.0 * (1.0 - fx * fy) + n) as u8])
    })
}

struct Samples(Vec<Duration>);

impl Samples {
    fn secs(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self.0.iter().map(Duration::as_secs_f64).collect();
        v.sort_by(f64::total_cmp);
        v
    }
    fn median(&self) -> f64 {
        let v = self.secs();
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            0.5 * (v[n / 2 - 1] + v[n / 2])
        }
    }
    /// Nearest-rank 90th percentile.
    fn p90(&self) -> f64 {
        let v = self.secs();
        v[((0.9 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
    }
    fn min(&self) -> f64 {
        self.secs()[0]
    }
}

/// Peak resident memory of this process (Linux `VmHWM`), in bytes.
pub fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_owned()))
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned())
}

pub fn threads() -> usize {
    std::env::var("RAYON_NUM_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

pub fn run(args: BenchArgs) -> Result<i32> {
    let scratch = tempdir()?;
    let tmp = scratch.path().to_path_buf();
    let input: PathBuf = match &args.input {
        Some(p) => p.clone(),
        None => {
            let p = tmp.join("synthetic.jpg");
            synthetic(args.size.0, args.size.1).save(&p).context("cannot write the synthetic image")?;
            p
        }
    };
    if args.host_only {
        return host_only(&args, &input, &tmp);
    }
    let device = args.model.open_device()?;
    let weights = args.model.checkpoint()?;
    let t0 = Instant::now();
    let model = args.model.load_on(&weights, &device.device)?;
    // The device worker's way of running the forward (graph replay on CUDA).
    let runner = moge::model::Runner::new(std::sync::Arc::new(model));
    let model = runner.model().clone();
    let cold = t0.elapsed();
    let opts = args.infer.options();
    let tokens = opts.tokens(model.config.num_tokens_range);

    let stage_names =
        ["decode", "preprocess", "encoder", "neck", "points_head", "normal_head", "mask_head", "scale_head", "refiner", "postprocess", "write npz"];
    let mut per_stage: Vec<Vec<Duration>> = vec![vec![]; stage_names.len()];
    let out_opts = args.out.options();
    let mut totals = Vec::new();
    let mut calls = Vec::new();
    let mut size = (0, 0);
    let mut grid = (0, 0);
    let refine_steps = model.refine_steps(&opts);
    // MoGe-3: each refine step's time per run, and what the last run's steps did.
    let mut step_times: Vec<Vec<Duration>> = vec![vec![]; refine_steps];
    let mut step_stats = Vec::new();
    for run in 0..args.warmup + args.runs {
        let mut laps: Vec<(&'static str, Duration)> = Vec::new();
        let start = Instant::now();
        let mut t = Instant::now();
        let mut lap = |name: &'static str, laps: &mut Vec<(&'static str, Duration)>| {
            let now = Instant::now();
            laps.push((name, now - t));
            t = now;
        };
        let img = moge::image_io::load_rgb(&input, true)?;
        lap("decode", &mut laps);
        let (w, h) = (img.width() as usize, img.height() as usize);
        let prep = model.prepare(img.as_raw(), w, h, tokens);
        lap("preprocess", &mut laps);
        let mut fwd_laps = Vec::new();
        let mut raw = model.forward_intermediates(&prep, Some(&mut fwd_laps))?.raw;
        laps.extend(fwd_laps);
        if refine_steps > 0 {
            let t = Instant::now();
            model.refine(&mut raw, refine_steps, false)?;
            laps.push(("refiner", t.elapsed()));
            if run >= args.warmup {
                for (times, s) in step_times.iter_mut().zip(&raw.refiner) {
                    times.push(s.total);
                }
            }
            step_stats = std::mem::take(&mut raw.refiner);
        }
        t = Instant::now();
        let pred = model.postprocess(&raw, (w, h, prep.grid), &opts);
        let mut lap2 = |name: &'static str, laps: &mut Vec<(&'static str, Duration)>| {
            let now = Instant::now();
            laps.push((name, now - t));
            t = now;
        };
        lap2("postprocess", &mut laps);
        moge::outputs::npz::write(&tmp.join("out.npz"), &pred, out_opts.npz_compression, out_opts.npz_normal)?;
        lap2("write npz", &mut laps);
        let total = start.elapsed();
        // The model call as the device worker makes it (upload, network, download). On the CPU
        // it is the network's laps; an asynchronous device is timed again without the per-part
        // synchronisation of the laps (on CUDA: a graph replay, see `MOGE_CUDA_GRAPHS`).
        let call = if model.device.is_cpu() {
            laps.iter().filter(|(n, _)| NETWORK.contains(n)).map(|(_, d)| *d).sum()
        } else {
            let call = Instant::now();
            runner.forward(&prep)?;
            call.elapsed()
        };
        if run >= args.warmup {
            totals.push(total);
            calls.push(call);
            for (name, d) in laps {
                if let Some(i) = stage_names.iter().position(|n| *n == name) {
                    per_stage[i].push(d);
                }
            }
        }
        size = (w, h);
        grid = prep.grid;
    }

    let totals = Samples(totals);
    let calls = Samples(calls);
    let peak = peak_rss();
    let source = match &args.input {
        Some(p) => p.display().to_string(),
        None => "synthetic JPEG".to_owned(),
    };
    let conditions = json!({
        "weights": weights.display().to_string(),
        "backbone": model.config.encoder.backbone,
        "num_tokens": tokens,
        "grid": [grid.0, grid.1],
        "image": source,
        "image_size": [size.0, size.1],
        "precision": format!("{:?}", model.precision).to_lowercase(),
        "device": device.name,
        "gpu": device.gpu,
        "cpu_because": device.cpu_because.as_ref().map(|e| e.to_string()),
        "threads": threads(),
        "cpu": cpu_name(),
        "cpu_route": model.device.is_cpu().then(|| moge::model::cpu::route(model.precision)),
        "cuda_graphs": runner.cuda_graphs(),
        "refine_steps": refine_steps,
        "runs": args.runs,
        "warmup": args.warmup,
        "version": env!("CARGO_PKG_VERSION"),
    });
    // Each refine step: its median time, its share of the model call, its voxels and work.
    let steps: Vec<serde_json::Value> = step_times
        .into_iter()
        .zip(&step_stats)
        .map(|(t, s)| {
            let t = Samples(t);
            json!({
                "median_s": t.median(), "min_s": t.min(), "share_of_model_call": t.median() / calls.median(),
                "convolutions_s": s.convolutions.as_secs_f64(), "structure_s": s.structure.as_secs_f64(),
                "voxels_per_level": s.voxels, "pairs_per_level": s.pairs, "gmac": s.macs as f64 / 1e9, "conv_gmac": s.conv_macs as f64 / 1e9,
            })
        })
        .collect();
    let stages: Vec<(&str, Samples)> = stage_names.iter().zip(per_stage).filter(|(_, v)| !v.is_empty()).map(|(n, v)| (*n, Samples(v))).collect();
    if args.json {
        let st: serde_json::Map<String, serde_json::Value> =
            stages.iter().map(|(n, s)| (n.to_string(), json!({"median_s": s.median(), "min_s": s.min(), "p90_s": s.p90()}))).collect();
        let out = json!({
            "conditions": conditions,
            "cold_start_s": cold.as_secs_f64(),
            "per_image_s": {"median": totals.median(), "p90": totals.p90(), "min": totals.min(), "all": totals.0.iter().map(Duration::as_secs_f64).collect::<Vec<_>>()},
            "model_call_s": {"median": calls.median(), "p90": calls.p90(), "min": calls.min()},
            "stages": st,
            "refiner_steps": steps,
            "peak_rss_bytes": peak,
        });
        moge::outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(EXIT_OK);
    }
    moge::outln!(
        "moge bench: {} ({}), {} tokens (grid {}x{}), {} {}x{}, {}, {}, {} threads, {}",
        model.config.encoder.backbone,
        weights.display(),
        tokens,
        grid.0,
        grid.1,
        source,
        size.0,
        size.1,
        format!("{:?}", model.precision).to_lowercase(),
        device.describe(),
        threads(),
        cpu_name()
    );
    if model.device.is_cpu() {
        moge::outln!("{}", moge::model::cpu::route_description(model.precision));
    }
    if let Some(g) = runner.cuda_graphs() {
        moge::outln!("CUDA graphs (the model call): {g}");
    }
    moge::outln!("cold start (load weights): {:.3} s", cold.as_secs_f64());
    moge::outln!(
        "per image, warm, {} runs after {} warm-up: median {:.3} s, p90 {:.3} s, min {:.3} s",
        args.runs,
        args.warmup,
        totals.median(),
        totals.p90(),
        totals.min()
    );
    moge::outln!("model call (upload, network, download): median {:.4} s, min {:.4} s", calls.median(), calls.min());
    let sum: f64 = stages.iter().map(|(_, s)| s.median()).sum();
    moge::outln!("{:<24} {:>10} {:>10} {:>7}", "stage", "median s", "min s", "share");
    for (name, s) in &stages {
        moge::outln!("{:<24} {:>10.4} {:>10.4} {:>6.1}%", name, s.median(), s.min(), 100.0 * s.median() / sum);
    }
    for (i, s) in steps.iter().enumerate() {
        moge::outln!(
            "refine step {}: median {:.4} s, {:.1}% of the model call; {} voxels at full resolution, {:.1} GMAC ({:.1} in sparse convolutions, their blocks at {:.0} GMAC/s)",
            i + 1,
            s["median_s"].as_f64().unwrap_or(0.0),
            100.0 * s["share_of_model_call"].as_f64().unwrap_or(0.0),
            s["voxels_per_level"][0],
            s["gmac"].as_f64().unwrap_or(0.0),
            s["conv_gmac"].as_f64().unwrap_or(0.0),
            s["conv_gmac"].as_f64().unwrap_or(0.0) / s["convolutions_s"].as_f64().unwrap_or(f64::NAN),
        );
    }
    if let Some(p) = peak {
        moge::outln!("peak memory (RSS high-water mark): {:.0} MiB", p as f64 / (1024.0 * 1024.0));
    }
    Ok(EXIT_OK)
}

/// The laps of [`moge::Model::forward_intermediates`], and MoGe-3's refine steps after it.
const NETWORK: [&str; 7] = ["encoder", "neck", "points_head", "normal_head", "mask_head", "scale_head", "refiner"];

/// A scratch folder deleted when dropped, so that a bench which fails half-way leaves nothing behind.
fn tempdir() -> Result<tempfile::TempDir> {
    let base = std::env::temp_dir();
    tempfile::Builder::new().prefix("moge-bench-").tempdir_in(&base).with_context(|| format!("{}: cannot create a scratch folder", base.display()))
}

/// `--host-only`: per-stage busy time of the host work for one photo, in milliseconds.
fn host_only(args: &BenchArgs, input: &std::path::Path, tmp: &std::path::Path) -> Result<i32> {
    use moge::pipeline::inputs;
    let (weights, model) = args.model.load()?;
    let cfg = super::pipeline_config(&tmp.join("out"), &args.model, weights, &args.infer, args.out.options(), &Default::default());
    std::fs::create_dir_all(&cfg.output)?;
    let photo = inputs::file_input(input);
    let timings = moge::pipeline::host_only::host_only(std::sync::Arc::new(model), &cfg, &photo, args.warmup as usize, args.runs as usize)?;
    let (w, h) = image::image_dimensions(input).unwrap_or((0, 0));
    let ms = |f: &dyn Fn(&moge::outputs::json::Timings) -> f64| Samples(timings.iter().map(|t| Duration::from_secs_f64(f(t) / 1e3)).collect());
    let stages: Vec<(&str, Samples)> = vec![
        ("decode", ms(&|t| t.decode)),
        ("prepare", ms(&|t| t.prepare)),
        ("postprocess", ms(&|t| t.postprocess)),
        ("write", ms(&|t| t.write.unwrap_or(0.0))),
        ("host total", ms(&|t| t.decode + t.prepare + t.postprocess + t.write.unwrap_or(0.0))),
    ];
    let formats: Vec<String> = args.out.format.iter().map(|f| format!("{f:?}").to_lowercase()).collect();
    if args.json {
        let st: serde_json::Map<String, serde_json::Value> =
            stages.iter().map(|(n, s)| (n.to_string(), json!({"median_ms": s.median() * 1e3, "min_ms": s.min() * 1e3, "p90_ms": s.p90() * 1e3}))).collect();
        moge::outln!(
            "{}",
            json!({"mode": "host-only", "image_size": [w, h], "formats": formats, "npz_compression": format!("{:?}", cfg.outputs.npz_compression).to_lowercase(),
                   "runs": args.runs, "threads": 1, "cpu": cpu_name(), "stages": st})
        );
        return Ok(EXIT_OK);
    }
    moge::outln!(
        "host stages only, one thread, {w}x{h}, --format {} (npz {:?}), {} runs after {} warm-up ({}):",
        formats.join(","),
        cfg.outputs.npz_compression,
        args.runs,
        args.warmup,
        cpu_name()
    );
    moge::outln!("{:<12} {:>10} {:>10} {:>10}", "stage", "median ms", "min ms", "p90 ms");
    for (name, s) in &stages {
        moge::outln!("{:<12} {:>10.1} {:>10.1} {:>10.1}", name, s.median() * 1e3, s.min() * 1e3, s.p90() * 1e3);
    }
    Ok(EXIT_OK)
}
