//! The three stages, joined by bounded channels so that only a few images are in memory at
//! any time, whatever the size of the directory:
//!
//! ```text
//! feeder ─▶ decode+prepare (N threads) ─▶ forward (1 device worker) ─▶ postprocess+write (N threads) ─▶ collector
//! ```
//!
//! The device worker owns the forwards and runs them one after another; host work for the
//! next and previous images runs on the other threads meanwhile. Results are reported as
//! they finish (not in input order). A stop request (Ctrl-C) or a fatal error stops the
//! feeder; queued images are dropped, images already through the forward are written.

use std::cell::Cell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use crossbeam_channel::{bounded, unbounded};
use image::RgbImage;

use super::fit::{self, Canvas, FitMode, Placement};
use super::inputs::Input;
use crate::infer::InferOptions;
use crate::model::{Prepared, RawOutput};
use crate::outputs::json::{DepthStats, InferenceInfo, ModelInfo, Sidecar, Timings};
use crate::outputs::{self, OutputOptions};
use crate::Model;

/// Everything fixed for one run.
#[derive(Debug, Clone)]
pub struct Config {
    pub output: PathBuf,
    pub outputs: OutputOptions,
    pub infer: InferOptions,
    pub fit: FitMode,
    pub canvas: Canvas,
    pub decode: crate::image_io::DecodeOptions,
    /// Host threads per host stage (decode, encode).
    pub jobs: usize,
    pub skip_existing: bool,
    /// Draw a progress bar (only when stderr is a terminal).
    pub progress: bool,
    /// No summary line.
    pub quiet: bool,
    /// One JSON line per image on stdout.
    pub json: bool,
    /// Per-stage timing report and a forward-only comparison at the end.
    pub stats: bool,
    /// Model id for the sidecar, and the weights file to digest.
    pub model_id: String,
    pub weights: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Failed,
    Skipped,
}

/// The outcome of one image.
#[derive(Debug, Clone)]
pub struct Record {
    pub input: PathBuf,
    pub status: Status,
    pub outputs: Vec<PathBuf>,
    pub timings: Timings,
    pub error: Option<String>,
    /// An error that every later image would hit too (disk full, read-only output).
    pub fatal: bool,
    /// Valid pixels clamped in the depth PNG.
    pub saturated: usize,
    /// `Prediction::summary()` of a processed image.
    pub summary: Option<String>,
    /// What was wrong with an input that was processed all the same (`--allow-truncated`).
    pub warning: Option<String>,
}

/// Busy time per stage, summed over images (seconds).
#[derive(Debug, Clone, Default)]
pub struct StageTotals {
    pub decode: f64,
    pub prepare: f64,
    pub forward: f64,
    pub postprocess: f64,
    pub write: f64,
}

#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub total: usize,
    pub done: usize,
    pub failed: usize,
    pub skipped: usize,
    pub interrupted: bool,
    pub fatal: Option<String>,
    pub wall: Duration,
    pub stages: StageTotals,
    /// Back-to-back forwards on sample images after the run: (seconds per image, samples).
    pub forward_only: Option<(f64, usize)>,
    /// Valid pixels clamped in depth PNGs, over the run.
    pub depth_png_saturated: usize,
}

impl Summary {
    pub fn not_started(&self) -> usize {
        self.total - self.done - self.failed - self.skipped
    }
}

struct Job {
    input: Input,
}

struct Decoded {
    input: Input,
    /// The photo, kept for the outputs that are coloured by it.
    photo: Option<RgbImage>,
    photo_size: (usize, usize),
    placement: Placement,
    opts: InferOptions,
    prep: Prepared,
    timings: Timings,
    warning: Option<String>,
}

struct Forwarded {
    d: Decoded,
    raw: RawOutput,
}

thread_local! {
    static IN_GUARD: Cell<bool> = const { Cell::new(false) };
}

/// Panics inside guarded stage work become errors of that image; silence the default
/// report for those (the image's error line says it), keep it for anything else.
pub fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_GUARD.with(|g| g.get()) {
                prev(info)
            }
        }));
    });
}

fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    IN_GUARD.with(|g| g.set(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    IN_GUARD.with(|g| g.set(false));
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(anyhow!("internal error: {msg}"))
        }
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// SHA-256 of a file, read in 1 MiB blocks.
pub fn sha256_file(path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut f = std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("{}: cannot read", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The output stem of an input.
pub fn stem(cfg: &Config, input: &Input) -> PathBuf {
    cfg.output.join(&input.rel)
}

/// The error chain on one line, leaving out causes whose text the line already ends with
/// (the image crate repeats its source in its own message).
pub fn error_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

fn failed(input: &Input, err: &anyhow::Error, timings: Timings) -> Record {
    let msg = error_line(err);
    let shown = input.path.display().to_string();
    // Errors from reading the photo already start with its path.
    let error = if msg.starts_with(&shown) { msg } else { format!("{shown}: {msg}") };
    Record {
        input: input.path.clone(),
        status: Status::Failed,
        outputs: vec![],
        timings,
        error: Some(error),
        fatal: outputs::is_fatal_io(err),
        saturated: 0,
        summary: None,
        warning: None,
    }
}

fn decode(model: &Model, cfg: &Config, input: &Input) -> Result<Decoded> {
    let mut timings = Timings::default();
    let t = Instant::now();
    let crate::image_io::Decoded { image: photo, warning } = crate::image_io::load_rgb_with(&input.path, &cfg.decode)?;
    timings.decode = ms(t);
    let t = Instant::now();
    let photo_size = (photo.width() as usize, photo.height() as usize);
    let (work, placement) = fit::place(&photo, cfg.fit, cfg.canvas)?;
    let opts = fit::work_options(&cfg.infer, placement, photo_size.0);
    let img = work.as_ref().unwrap_or(&photo);
    let tokens = opts.tokens(model.config.num_tokens_range);
    let prep = model.prepare(img.as_raw(), img.width() as usize, img.height() as usize, tokens);
    timings.prepare = ms(t);
    let photo = cfg.outputs.needs_image().then_some(photo);
    let warning = warning.map(|w| format!("{}: {w}", input.path.display()));
    Ok(Decoded { input: input.clone(), photo, photo_size, placement, opts, prep, timings, warning })
}

fn encode(model: &Model, cfg: &Config, sha: &OnceLock<String>, f: Forwarded) -> Result<Record> {
    let Forwarded { d, raw } = f;
    let mut timings = d.timings.clone();
    let t = Instant::now();
    let work = model.postprocess(&raw, (d.prep.width, d.prep.height, d.prep.grid), &d.opts);
    let pred = fit::restore(work, d.placement, d.photo_size.0, d.photo_size.1, &cfg.infer);
    let stats = DepthStats::of(&pred);
    timings.postprocess = ms(t);
    let stem = stem(cfg, &d.input);
    // Everything from here is the write stage, the sidecar's assembly included.
    let t = Instant::now();
    let mut sidecar = cfg.outputs.wants_sidecar().then(|| {
        let model_info = ModelInfo {
            id: cfg.model_id.clone(),
            weights_sha256: sha.get_or_init(|| sha256_file(&cfg.weights).unwrap_or_else(|e| format!("unavailable: {e:#}"))).clone(),
        };
        let inference = InferenceInfo {
            device: crate::device::name_of(&model.device),
            num_tokens: d.opts.tokens(model.config.num_tokens_range),
            grid: d.prep.grid,
            fit: cfg.fit.name().into(),
            canvas: (cfg.fit != FitMode::Exact).then_some((cfg.canvas.width, cfg.canvas.height)),
            exif_orientation: cfg.decode.apply_exif,
            fov_x_given: cfg.infer.fov_x,
        };
        Sidecar::new(d.input.path.display().to_string(), &pred, stats.clone(), cfg.outputs.depth_png_scale, model_info, inference, timings.clone())
    });
    let written = outputs::write_all(&stem, &pred, d.photo.as_ref(), &cfg.outputs, sidecar.as_mut())?;
    let saturated = match &sidecar {
        Some(s) if cfg.outputs.wants(outputs::Format::Png) => s.depth_png.saturated,
        _ => 0,
    };
    timings.write = Some(ms(t));
    Ok(Record {
        input: d.input.path.clone(),
        status: Status::Ok,
        outputs: written,
        timings,
        error: None,
        fatal: false,
        saturated,
        summary: Some(pred.summary_with_median(stats.median.unwrap_or(f32::NAN))),
        warning: d.warning,
    })
}

/// The host stages alone, on one photo: one forward first, whose output is then reused, so
/// that `warmup + runs` rounds of decode, prepare, postprocess and write measure what a device
/// faster than this CPU would leave to the host (`moge bench --host-only`). Returns the timings
/// of the timed rounds.
pub fn host_only(model: &Model, cfg: &Config, input: &Input, warmup: usize, runs: usize) -> Result<Vec<Timings>> {
    let first = decode(model, cfg, input)?;
    let raw = model.forward(&first.prep).context("forward failed")?;
    let sha = OnceLock::new();
    let mut out = Vec::with_capacity(runs);
    for round in 0..warmup + runs {
        let d = decode(model, cfg, input)?;
        let rec = encode(model, cfg, &sha, Forwarded { d, raw: raw.clone() })?;
        if round >= warmup {
            out.push(rec.timings);
        }
    }
    Ok(out)
}

/// One image through every stage on the calling thread (`moge predict`).
pub fn process_one(model: &Model, cfg: &Config, input: &Input) -> Record {
    install_panic_hook();
    if let Some(p) = &input.problem {
        return failed(input, &anyhow!("{p}"), Timings::default());
    }
    let sha = OnceLock::new();
    let result = guarded(|| {
        let mut d = decode(model, cfg, input)?;
        let t = Instant::now();
        let raw = model.forward(&d.prep).context("forward failed")?;
        d.timings.forward = ms(t);
        encode(model, cfg, &sha, Forwarded { d, raw })
    });
    result.unwrap_or_else(|e| failed(input, &e, Timings::default()))
}

/// On a CPU-only run the host stages share the cores with the forward: at the lowest priority
/// they run in the forward's gaps (its serial parts, the ends of parallel loops) instead of
/// taking turns with its threads, yet never starve when other processes load the machine.
/// `moge batch --stats`, ViT-S bf16, 12 photos, npz: batch / forward-only 95.1 / 94.4 % → 97.2 /
/// 96.9 % (PERFORMANCE.md step 11).
fn yield_to_device(model: &Model) {
    #[cfg(target_os = "linux")]
    if model.device.is_cpu() {
        // Linux applies PRIO_PROCESS with a thread id to that thread alone. Failure only costs speed.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, 19);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = model;
}

/// Runs the pipeline over `inputs`. `stop` is set from outside (Ctrl-C) to stop taking new
/// images. Reports each image as it finishes; returns the summary.
pub fn run(model: Arc<Model>, inputs: Vec<Input>, cfg: &Config, stop: &AtomicBool) -> Summary {
    install_panic_hook();
    let started = Instant::now();
    let jobs = cfg.jobs.max(1);
    let halt = AtomicBool::new(false);
    let halted = || halt.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed);
    let sha = OnceLock::new();
    let samples: std::sync::Mutex<Vec<Prepared>> = std::sync::Mutex::new(Vec::new());
    let has_normal = model.has_normal();
    let total = inputs.len();

    let (job_tx, job_rx) = bounded::<Job>(jobs);
    let (prep_tx, prep_rx) = bounded::<Decoded>(2);
    let (fwd_tx, fwd_rx) = bounded::<Forwarded>(jobs);
    let (rec_tx, rec_rx) = unbounded::<Record>();

    let mut summary = Summary { total, ..Default::default() };
    std::thread::scope(|s| {
        // The digest of a large checkpoint takes seconds: start it at once, off the path.
        if cfg.outputs.wants_sidecar() {
            s.spawn(|| {
                yield_to_device(&model);
                sha.get_or_init(|| sha256_file(&cfg.weights).unwrap_or_else(|e| format!("unavailable: {e:#}")));
            });
        }
        // Feeder.
        {
            let rec_tx = rec_tx.clone();
            let halted = &halted;
            s.spawn(move || {
                for input in inputs {
                    if halted() {
                        break;
                    }
                    if let Some(p) = &input.problem {
                        let _ = rec_tx.send(failed(&input, &anyhow!("{p}"), Timings::default()));
                        continue;
                    }
                    let planned = outputs::planned_paths(&stem(cfg, &input), &cfg.outputs, has_normal);
                    if cfg.skip_existing && planned.iter().all(|p| p.exists()) {
                        let _ = rec_tx.send(Record {
                            input: input.path.clone(),
                            status: Status::Skipped,
                            outputs: planned,
                            timings: Timings::default(),
                            error: None,
                            fatal: false,
                            saturated: 0,
                            summary: None,
                            warning: None,
                        });
                        continue;
                    }
                    if job_tx.send(Job { input }).is_err() {
                        break;
                    }
                }
            });
        }
        // Decode + prepare.
        for _ in 0..jobs {
            let (job_rx, prep_tx, rec_tx, model) = (job_rx.clone(), prep_tx.clone(), rec_tx.clone(), &model);
            let halted = &halted;
            s.spawn(move || {
                yield_to_device(model);
                for job in job_rx {
                    if halted() {
                        continue; // drain: dropped, never started
                    }
                    match guarded(|| decode(model, cfg, &job.input)) {
                        Ok(d) => {
                            if prep_tx.send(d).is_err() {
                                break;
                            }
                        }
                        Err(e) => {
                            let _ = rec_tx.send(failed(&job.input, &e, Timings::default()));
                        }
                    }
                }
            });
        }
        drop((job_rx, prep_tx));
        // The device worker.
        {
            let (fwd_tx, rec_tx, model, samples) = (fwd_tx, rec_tx.clone(), &model, &samples);
            let halted = &halted;
            s.spawn(move || {
                for mut d in prep_rx {
                    if halted() {
                        continue;
                    }
                    let t = Instant::now();
                    match guarded(|| model.forward(&d.prep)) {
                        Ok(raw) => {
                            d.timings.forward = ms(t);
                            if cfg.stats {
                                let mut v = samples.lock().unwrap_or_else(|e| e.into_inner());
                                if v.len() < STATS_SAMPLES {
                                    v.push(d.prep.clone());
                                }
                            }
                            if fwd_tx.send(Forwarded { d, raw }).is_err() {
                                break;
                            }
                        }
                        Err(e) => {
                            let _ = rec_tx.send(failed(&d.input, &e.context("forward failed"), d.timings.clone()));
                        }
                    }
                }
            });
        }
        // Post-process + write.
        for _ in 0..jobs {
            let (fwd_rx, rec_tx, model, sha) = (fwd_rx.clone(), rec_tx.clone(), &model, &sha);
            s.spawn(move || {
                yield_to_device(model);
                for f in fwd_rx {
                    let input = f.d.input.clone();
                    let timings = f.d.timings.clone();
                    let rec = guarded(|| encode(model, cfg, sha, f)).unwrap_or_else(|e| failed(&input, &e, timings));
                    let _ = rec_tx.send(rec);
                }
            });
        }
        drop((fwd_rx, rec_tx));

        // Collector (this thread).
        let pb = progress_bar(cfg, total);
        let stdout = std::io::stdout();
        for rec in rec_rx {
            match rec.status {
                Status::Ok => summary.done += 1,
                Status::Failed => summary.failed += 1,
                Status::Skipped => summary.skipped += 1,
            }
            summary.depth_png_saturated += rec.saturated;
            if rec.status == Status::Ok {
                let st = &mut summary.stages;
                st.decode += rec.timings.decode / 1e3;
                st.prepare += rec.timings.prepare / 1e3;
                st.forward += rec.timings.forward / 1e3;
                st.postprocess += rec.timings.postprocess / 1e3;
                st.write += rec.timings.write.unwrap_or(0.0) / 1e3;
            }
            if let Some(w) = &rec.warning {
                pb.suspend(|| crate::errln!("moge: warning: {w}"));
            }
            if let Some(err) = &rec.error {
                pb.suspend(|| crate::errln!("moge: {err}"));
                if rec.fatal && summary.fatal.is_none() {
                    summary.fatal = Some(err.clone());
                    halt.store(true, Ordering::Relaxed);
                }
            }
            if cfg.json {
                let line = serde_json::json!({
                    "input": rec.input.display().to_string(),
                    "status": rec.status,
                    "outputs": rec.outputs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
                    "timings_ms": rec.timings,
                    "error": rec.error,
                    "warning": rec.warning,
                });
                let mut out = stdout.lock();
                // A closed stdout (`| head`) must not stop the batch.
                let _ = writeln!(out, "{line}").and_then(|_| out.flush());
            }
            pb.inc(1);
            if summary.failed > 0 {
                pb.set_message(format!("{} failed", summary.failed));
            }
        }
        pb.finish_and_clear();
    });
    summary.interrupted = stop.load(Ordering::Relaxed);
    summary.wall = started.elapsed();
    if cfg.stats && !summary.interrupted {
        let samples = samples.into_inner().unwrap_or_else(|e| e.into_inner());
        summary.forward_only = forward_only(&model, &samples);
    }
    summary
}

/// Prepared inputs kept for the forward-only comparison of `--stats`.
const STATS_SAMPLES: usize = 8;

/// Seconds per forward, back to back with no host work beside it (after one warm-up).
fn forward_only(model: &Model, samples: &[Prepared]) -> Option<(f64, usize)> {
    let first = samples.first()?;
    model.forward(first).ok()?;
    let t = Instant::now();
    for p in samples {
        model.forward(p).ok()?;
    }
    Some((t.elapsed().as_secs_f64() / samples.len() as f64, samples.len()))
}

fn progress_bar(cfg: &Config, total: usize) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !cfg.progress || cfg.quiet || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::with_draw_target(Some(total as u64), indicatif::ProgressDrawTarget::stderr());
    let style = indicatif::ProgressStyle::with_template("{elapsed_precise} {wide_bar} {pos}/{len} {rate} ETA {eta} {msg}")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .with_key("rate", |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.2} images/s", s.per_sec());
        });
    pb.set_style(style);
    pb
}

/// The summary and (with `stats`) the per-stage report, for stderr.
pub fn report(s: &Summary, cfg: &Config) -> String {
    let wall = s.wall.as_secs_f64();
    let rate = if wall > 0.0 { s.done as f64 / wall } else { 0.0 };
    let mut out = format!(
        "moge: {} done, {} failed, {} skipped{} in {:.1} s ({:.2} images/s)",
        s.done,
        s.failed,
        s.skipped,
        if s.not_started() > 0 { format!(", {} not started", s.not_started()) } else { String::new() },
        wall,
        rate
    );
    if s.depth_png_saturated > 0 {
        out.push_str(&format!("; {} depth PNG values saturated", s.depth_png_saturated));
    }
    if cfg.stats && s.done > 0 {
        let n = s.done as f64;
        let st = &s.stages;
        out.push_str(&format!(
            "\nmoge: stage busy time over {} images, {} host threads per host stage, wall {:.2} s:",
            s.done, cfg.jobs, wall
        ));
        for (name, busy, threads) in [
            ("decode", st.decode, cfg.jobs),
            ("prepare", st.prepare, cfg.jobs),
            ("forward", st.forward, 1),
            ("postprocess", st.postprocess, cfg.jobs),
            ("write", st.write, cfg.jobs),
        ] {
            out.push_str(&format!(
                "\n  {name:<12} {busy:>9.3} s  {:>9.1} ms/image  {:>5.1} % of its threads' wall",
                busy / n * 1e3,
                100.0 * busy / (wall * threads as f64)
            ));
        }
        out.push_str(&format!("\n  device busy {:.1} % of wall", 100.0 * st.forward / wall));
        if let Some((per, k)) = s.forward_only {
            out.push_str(&format!(
                "\n  forward-only: {:.1} ms/image alone ({} of the images again, back to back, after the run) = {:.2} images/s; {:.1} ms/image inside the pipeline\n  batch / forward-only throughput: {:.1} %",
                per * 1e3,
                k,
                1.0 / per,
                st.forward / n * 1e3,
                100.0 * rate * per
            ));
        }
    }
    out
}
