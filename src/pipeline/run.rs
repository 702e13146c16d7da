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

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use crossbeam_channel::{bounded, unbounded};
use image::RgbImage;

use super::fit::{Canvas, FitMode};
use super::guard::{guarded, install_panic_hook};
use super::inputs::Input;
use super::stages::{self, ms, Plan, Staged};
use super::worker::{DeviceWorker, Forward, Work};
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
    /// Requests in flight at once with a remote engine.
    pub in_flight: usize,
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

/// Where the forwards run.
#[derive(Clone)]
pub enum Engine {
    /// The model in this process, on the device worker.
    Local(Arc<Model>),
    /// A server that runs the model and its post-processing (`moge serve`, or the Tenstorrent
    /// MoGe-2 server): photos are decoded here, sent several at a time, and the answers written
    /// here.
    Remote(Arc<crate::remote::Client>),
}

impl Engine {
    fn local(&self) -> Option<&Model> {
        match self {
            Engine::Local(m) => Some(m),
            Engine::Remote(_) => None,
        }
    }

    fn has_normal(&self) -> bool {
        match self {
            Engine::Local(m) => m.has_normal(),
            // tt-MoGe does not say; its published model has the normal head.
            Engine::Remote(c) => c.info().get("has_normal").and_then(|v| v.as_bool()).unwrap_or(true),
        }
    }
}

/// A photo past the decode stage, with what the middle stage needs of it.
struct Decoded {
    input: Input,
    /// The photo, kept for the outputs that are coloured by it.
    photo: Option<RgbImage>,
    photo_size: (usize, usize),
    timings: Timings,
    warning: Option<String>,
}

enum Payload {
    /// The network's input.
    Local(Staged),
    /// The image file to send.
    Remote(Vec<u8>),
}

/// What the device worker runs.
struct LocalItem {
    d: Decoded,
    staged: Staged,
}

impl Work for LocalItem {
    fn prepared(&self) -> &Prepared {
        &self.staged.prep
    }
}

enum Outcome {
    Local { staged: Staged, raw: RawOutput },
    Remote(Box<crate::remote::Response>),
}

impl Config {
    fn plan(&self) -> Plan {
        let infer = InferOptions {
            point_map: self.infer.point_map && self.outputs.needs_points(),
            normal_map: self.infer.normal_map && self.outputs.needs_normal_floats(),
            ..self.infer.clone()
        };
        Plan { infer, fit: self.fit, canvas: self.canvas }
    }
}

struct Forwarded {
    d: Decoded,
    out: Outcome,
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

/// The SHA-256 of a checkpoint for sidecars and `/info`, or why it is unavailable.
pub fn digest_or_reason(path: &Path) -> String {
    sha256_file(path).unwrap_or_else(|e| format!("unavailable: {e:#}"))
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

fn decode(engine: &Engine, cfg: &Config, input: &Input) -> Result<(Decoded, Payload)> {
    let mut timings = Timings::default();
    let t = Instant::now();
    let (photo, warning, payload) = match engine {
        Engine::Local(model) => {
            let crate::image_io::Decoded { image: photo, warning } = crate::image_io::load_rgb_with(&input.path, &cfg.decode)?;
            timings.decode = ms(t);
            let staged = stages::prepare(model, &photo, &cfg.plan())?;
            timings.prepare = staged.prepare_ms;
            (photo, warning, Payload::Local(staged))
        }
        Engine::Remote(_) => {
            // Decoded here all the same: a damaged photo fails here with its reason, and ply /
            // glb take their colours from it.
            let loaded = crate::image_io::load_with_source(&input.path, &cfg.decode)?;
            timings.decode = ms(t);
            let t = Instant::now();
            let send = crate::remote::image_for_server(&loaded.bytes, &loaded.source, &loaded.decoded.image)
                .with_context(|| format!("{}: cannot encode the photo for the server", input.path.display()))?
                .into_owned();
            timings.prepare = ms(t);
            (loaded.decoded.image, loaded.decoded.warning, Payload::Remote(send))
        }
    };
    let photo_size = (photo.width() as usize, photo.height() as usize);
    let photo = cfg.outputs.needs_image().then_some(photo);
    let warning = warning.map(|w| format!("{}: {w}", input.path.display()));
    Ok((Decoded { input: input.clone(), photo, photo_size, timings, warning }, payload))
}

/// The digest of the weights for sidecars: of the checkpoint here, or as the server says.
fn weights_digest(engine: &Engine, cfg: &Config) -> String {
    match engine {
        Engine::Local(_) => digest_or_reason(&cfg.weights),
        Engine::Remote(c) => c.info().get("weights_sha256").and_then(|v| v.as_str()).unwrap_or("unavailable: not given by the server").to_owned(),
    }
}

fn encode(engine: &Engine, cfg: &Config, sha: &OnceLock<String>, f: Forwarded) -> Result<Record> {
    let Forwarded { d, out } = f;
    let mut timings = d.timings.clone();
    let t = Instant::now();
    let (pred, device, num_tokens, grid, server) = match (out, engine) {
        (Outcome::Local { staged, raw }, Engine::Local(model)) => {
            let pred = stages::finish(model, &staged, &raw, &cfg.plan());
            (pred, crate::device::name_of(&model.device), staged.opts.tokens(model.config.num_tokens_range), staged.prep.grid, None)
        }
        (Outcome::Remote(r), Engine::Remote(client)) => {
            let r = *r;
            if (r.pred.width, r.pred.height) != d.photo_size {
                anyhow::bail!(
                    "the server at {} answered with {}x{} maps for a {}x{} photo",
                    client.url(),
                    r.pred.width,
                    r.pred.height,
                    d.photo_size.0,
                    d.photo_size.1
                );
            }
            let tokens = r.meta.get("num_tokens").and_then(|v| v.as_u64()).map(|n| n as u32).unwrap_or_else(|| cfg.infer.num_tokens.unwrap_or(0));
            let grid = r.meta.get("grid").and_then(|g| Some((g.get(0)?.as_u64()? as usize, g.get(1)?.as_u64()? as usize))).unwrap_or(r.pred.grid);
            let server = serde_json::json!({
                "url": client.url(),
                "model": client.model(),
                "device": client.device(),
                "attempts": r.attempts,
                "timing_ms": r.meta.get("timing_ms"),
            });
            (r.pred, format!("remote {}", client.device().unwrap_or("device")), tokens, grid, Some(server))
        }
        _ => anyhow::bail!("internal: an outcome of the other engine"),
    };
    let stats = DepthStats::of(&pred);
    timings.postprocess = ms(t);
    let stem = stem(cfg, &d.input);
    // Everything from here is the write stage, the sidecar's assembly included.
    let t = Instant::now();
    let mut sidecar = cfg.outputs.wants_sidecar().then(|| {
        let model_info = ModelInfo {
            id: match engine {
                Engine::Remote(c) => c.model().map(str::to_owned).unwrap_or_else(|| cfg.model_id.clone()),
                Engine::Local(_) => cfg.model_id.clone(),
            },
            weights_sha256: sha.get_or_init(|| weights_digest(engine, cfg)).clone(),
        };
        let inference = InferenceInfo {
            device,
            num_tokens,
            grid,
            fit: cfg.fit.name().into(),
            canvas: (cfg.fit != FitMode::Exact).then_some((cfg.canvas.width, cfg.canvas.height)),
            exif_orientation: cfg.decode.apply_exif,
            fov_x_given: cfg.infer.fov_x,
            server,
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
pub fn host_only(model: Arc<Model>, cfg: &Config, input: &Input, warmup: usize, runs: usize) -> Result<Vec<Timings>> {
    let engine = Engine::Local(model.clone());
    let Payload::Local(first) = decode(&engine, cfg, input)?.1 else { unreachable!("a local engine prepares locally") };
    let raw = model.forward(&first.prep).context("forward failed")?;
    let sha = OnceLock::new();
    let mut out = Vec::with_capacity(runs);
    for round in 0..warmup + runs {
        // Each round writes into a folder of its own, removed after it is timed, as a batch
        // writes each photo's outputs under new names: replacing the last round's files would
        // time their removal too, and on ext4 the flush to disk that a rename over an existing
        // file starts (`auto_da_alloc`; ~45 ms of a 60 MB npz, PERFORMANCE.md "Host stages").
        let cfg = Config { output: cfg.output.join(format!("round-{round}")), ..cfg.clone() };
        let (d, Payload::Local(staged)) = decode(&engine, &cfg, input)? else { unreachable!("a local engine prepares locally") };
        let rec = encode(&engine, &cfg, &sha, Forwarded { d, out: Outcome::Local { staged, raw: raw.clone() } })?;
        std::fs::remove_dir_all(&cfg.output).with_context(|| format!("{}: cannot remove", cfg.output.display()))?;
        if round >= warmup {
            out.push(rec.timings);
        }
    }
    Ok(out)
}

/// On a CPU-only run the host stages share the cores with the forward: at the lowest priority
/// they run in the forward's gaps (its serial parts, the ends of parallel loops) instead of
/// taking turns with its threads, yet never starve when other processes load the machine.
/// `moge batch --stats`, ViT-S bf16, 12 photos, npz: batch / forward-only 95.1 / 94.4 % → 97.2 /
/// 96.9 % (PERFORMANCE.md step 11).
fn yield_to_device(engine: &Engine) {
    #[cfg(target_os = "linux")]
    if engine.local().is_some_and(|m| m.device.is_cpu()) {
        // Linux applies PRIO_PROCESS with a thread id to that thread alone. Failure only costs speed.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, 19);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = engine;
}

/// The options sent with each photo: only those that differ from the defaults that moge serve
/// and tt-MoGe share, since a server may refuse a field it does not know.
fn remote_request(cfg: &Config) -> crate::protocol::PredictOptions {
    let mut r = crate::protocol::PredictOptions::from_options(&cfg.infer);
    if r.num_tokens == Some(crate::infer::DEFAULT_NUM_TOKENS) {
        r.num_tokens = None;
    }
    r.fit = (cfg.fit != FitMode::Exact).then_some(cfg.fit);
    r
}

/// Where forwards go and results come back: both middles deliver to the encoders' channel,
/// or a failure record to the collector.
#[derive(Clone)]
struct Sink {
    fwd_tx: crossbeam_channel::Sender<Forwarded>,
    rec_tx: crossbeam_channel::Sender<Record>,
    /// Prepared inputs kept for `--stats`' forward-only comparison.
    samples: Option<Arc<std::sync::Mutex<Vec<Prepared>>>>,
}

impl Sink {
    fn done(&self, d: Decoded, out: Outcome) {
        if let (Some(samples), Outcome::Local { staged, .. }) = (&self.samples, &out) {
            let mut v = samples.lock().unwrap_or_else(|e| e.into_inner());
            if v.len() < STATS_SAMPLES {
                v.push(staged.prep.clone());
            }
        }
        let _ = self.fwd_tx.send(Forwarded { d, out });
    }

    fn failed(&self, d: &Decoded, e: &anyhow::Error, fatal: bool) {
        let mut rec = failed(&d.input, e, d.timings.clone());
        rec.fatal |= fatal;
        let _ = self.rec_tx.send(rec);
    }
}

/// The middle stage: the device worker, or requests to a server, several in flight.
enum Middle {
    Local(DeviceWorker<LocalItem>),
    Remote { tx: std::sync::Mutex<Option<crossbeam_channel::Sender<(Decoded, Vec<u8>)>>>, threads: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>> },
}

impl Middle {
    fn start(engine: &Engine, cfg: &Config, sink: Sink, halted: impl Fn() -> bool + Clone + Send + 'static) -> Middle {
        match engine {
            Engine::Local(model) => Middle::Local(DeviceWorker::spawn(model.clone(), 2, halted, move |mut item: LocalItem, out| match out {
                Forward::Done { raw, ms } => {
                    item.d.timings.forward = ms;
                    sink.done(item.d, Outcome::Local { staged: item.staged, raw });
                }
                Forward::Failed(e) => sink.failed(&item.d, &e, false),
                // Stopped: "not started".
                Forward::Cancelled => {}
            })),
            Engine::Remote(client) => {
                let n = cfg.in_flight.max(1);
                let (tx, rx) = bounded::<(Decoded, Vec<u8>)>(n);
                let mut request = remote_request(cfg);
                // moge serve can send the normals as computed, so that the outputs are those of a
                // local run; tt-MoGe sends float16.
                let dtypes = client.info().get("npz_normal_dtypes").and_then(|v| v.as_array());
                if dtypes.is_some_and(|d| d.iter().any(|t| t == "float32")) {
                    request.npz_normal_dtype = Some(crate::outputs::npz::NormalDtype::Float32);
                }
                let threads = (0..n)
                    .map(|_| {
                        let (rx, client, sink, halted, request) = (rx.clone(), client.clone(), sink.clone(), halted.clone(), request.clone());
                        std::thread::spawn(move || {
                            for (mut d, bytes) in rx {
                                if halted() {
                                    continue;
                                }
                                let t = Instant::now();
                                match super::guard::catch(|| client.predict(&bytes, &request)) {
                                    Ok(Ok(r)) => {
                                        d.timings.forward = ms(t);
                                        sink.done(d, Outcome::Remote(Box::new(r)));
                                    }
                                    // A server that cannot be reached fails every later photo too.
                                    Ok(Err(e)) => {
                                        let fatal = e.is_unreachable();
                                        sink.failed(&d, &anyhow::Error::new(e), fatal)
                                    }
                                    Err(panic) => sink.failed(&d, &anyhow!("internal error: {panic}"), false),
                                }
                            }
                        })
                    })
                    .collect();
                Middle::Remote { tx: std::sync::Mutex::new(Some(tx)), threads: std::sync::Mutex::new(threads) }
            }
        }
    }

    /// Hands a decoded photo on, waiting while the stage is full; false once it has stopped.
    fn submit(&self, d: Decoded, payload: Payload) -> bool {
        match (self, payload) {
            (Middle::Local(w), Payload::Local(staged)) => w.submit(LocalItem { d, staged }).is_ok(),
            (Middle::Remote { tx, .. }, Payload::Remote(bytes)) => {
                let tx = tx.lock().unwrap_or_else(|e| e.into_inner()).clone();
                tx.is_some_and(|tx| tx.send((d, bytes)).is_ok())
            }
            _ => false,
        }
    }

    /// No more photos: waits until those handed on have gone through.
    fn close(&self) {
        match self {
            Middle::Local(w) => w.close(),
            Middle::Remote { tx, threads } => {
                tx.lock().unwrap_or_else(|e| e.into_inner()).take();
                for t in std::mem::take(&mut *threads.lock().unwrap_or_else(|e| e.into_inner())) {
                    let _ = t.join();
                }
            }
        }
    }
}

/// Runs the pipeline over `inputs`. `stop` is set from outside (Ctrl-C) to stop taking new
/// images. Reports each image as it finishes to stderr (and stdout with `json`) and to
/// `on_record`; returns the summary.
pub fn run(engine: Engine, inputs: Vec<Input>, cfg: &Config, stop: &Arc<AtomicBool>, mut on_record: impl FnMut(&Record)) -> Summary {
    install_panic_hook();
    let started = Instant::now();
    let jobs = cfg.jobs.max(1);
    // A fatal error (disk full) halts like a stop request, but is not an interruption.
    let halt = Arc::new(AtomicBool::new(false));
    let halted = {
        let (halt, stop) = (halt.clone(), stop.clone());
        move || halt.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed)
    };
    let sha = OnceLock::new();
    let samples: Arc<std::sync::Mutex<Vec<Prepared>>> = Arc::default();
    let has_normal = engine.has_normal();
    let total = inputs.len();

    let (job_tx, job_rx) = bounded::<Job>(jobs);
    let (fwd_tx, fwd_rx) = bounded::<Forwarded>(jobs);
    let (rec_tx, rec_rx) = unbounded::<Record>();
    let sink = Sink { fwd_tx, rec_tx: rec_tx.clone(), samples: cfg.stats.then(|| samples.clone()) };
    let middle = Middle::start(&engine, cfg, sink, halted.clone());

    let mut summary = Summary { total, ..Default::default() };
    std::thread::scope(|s| {
        // The digest of a large checkpoint takes seconds: start it at once, off the path.
        if cfg.outputs.wants_sidecar() {
            s.spawn(|| {
                yield_to_device(&engine);
                sha.get_or_init(|| weights_digest(&engine, cfg));
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
        // Decode + prepare, into the device worker's queue.
        let decoders: Vec<_> = (0..jobs)
            .map(|_| {
                let (job_rx, rec_tx, engine, middle) = (job_rx.clone(), rec_tx.clone(), &engine, &middle);
                let halted = &halted;
                s.spawn(move || {
                    yield_to_device(engine);
                    for job in job_rx {
                        if halted() {
                            continue; // drain: dropped, never started
                        }
                        match guarded(|| decode(engine, cfg, &job.input)) {
                            Ok((d, payload)) => {
                                if !middle.submit(d, payload) {
                                    break;
                                }
                            }
                            Err(e) => {
                                let _ = rec_tx.send(failed(&job.input, &e, Timings::default()));
                            }
                        }
                    }
                })
            })
            .collect();
        drop(job_rx);
        // Once every decoder is done, the middle stage finishes and lets the encoders end.
        let middle = &middle;
        s.spawn(move || {
            for d in decoders {
                let _ = d.join();
            }
            middle.close();
        });
        // Post-process + write.
        for _ in 0..jobs {
            let (fwd_rx, rec_tx, engine, sha) = (fwd_rx.clone(), rec_tx.clone(), &engine, &sha);
            s.spawn(move || {
                yield_to_device(engine);
                for f in fwd_rx {
                    let input = f.d.input.clone();
                    let timings = f.d.timings.clone();
                    let rec = guarded(|| encode(engine, cfg, sha, f)).unwrap_or_else(|e| failed(&input, &e, timings));
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
            pb.suspend(|| on_record(&rec));
            pb.inc(1);
            if summary.failed > 0 {
                pb.set_message(format!("{} failed", summary.failed));
            }
        }
        pb.finish_and_clear();
    });
    summary.interrupted = stop.load(Ordering::Relaxed);
    // Once per run rather than per file (see `outputs::sync_written`); a failure here is a
    // failure of the run: outputs reported as written may not be on disk.
    if let Err(e) = outputs::sync_written() {
        summary.fatal.get_or_insert_with(|| error_line(&e));
    }
    summary.wall = started.elapsed();
    if let (true, false, Some(model)) = (cfg.stats, summary.interrupted, engine.local()) {
        let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
        summary.forward_only = forward_only(model, &samples);
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
        out.push_str(&format!("\nmoge: stage busy time over {} images, {} host threads per host stage, wall {:.2} s:", s.done, cfg.jobs, wall));
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
