//! The three stages, joined by bounded channels so that only a few images are in memory at
//! any time, whatever the size of the directory:
//!
//! ```text
//! feeder ─▶ decode+prepare (N threads) ─▶ middle (the device worker, or requests to a server) ─▶ postprocess+write (N threads) ─▶ collector
//! ```
//!
//! The middle stage is a [`Backend`]; the stages around it are the same for every backend.
//! Host work for the next and previous images runs beside the middle stage. Results are
//! reported as they finish (not in input order). A stop request (Ctrl-C) or a fatal error
//! stops the feeder; queued images are dropped, images already through the forward are written.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use anyhow::{anyhow, Result};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use image::RgbImage;

pub use super::config::{default_jobs, Config};

use super::backend::Backend;
use super::guard::{guarded, install_panic_hook};
use super::inputs::Input;
use super::local::LocalBackend;
use super::plan::{ms, Plan};
use super::pool::PoolBackend;
use super::record::{Observer, OnRecord, Record, Status};
use super::remote::RemoteBackend;
use super::report::Summary;
use super::shared::Shared;
use super::video::depth::DepthVideos;
use super::video::feed::{done_depth, feed_video};
use super::video::scale::{Raw, ScaleSmoother};
use super::worker::Worker;
use crate::console::Notice;
use crate::model::v2::Model;
use crate::outputs::json::{DepthStats, FrameInfo, ModelInfo, Sidecar, Timings};
use crate::outputs::{self};
use crate::remote::pool::Pool;

/// Where the forwards run.
#[derive(Clone)]
pub enum Engine {
    /// The model in this process, on the device worker.
    Local(Arc<Model>),
    /// A server that runs the model and its post-processing (`moge serve`, or the Tenstorrent
    /// MoGe-2 server): photos are decoded here, sent several at a time, and the answers written
    /// here.
    Remote(Arc<crate::remote::Client>),
    /// Several such servers, one per device, each photo sent to the least loaded one that is
    /// up (see [`crate::remote::pool`]).
    Pool(Arc<Pool>),
}

/// Runs the pipeline over `inputs` on `engine`. `stop` is set from outside (Ctrl-C) to stop
/// taking new images. Hands each image's record to `on_record` as it finishes and returns the
/// summary; prints nothing.
pub fn run(engine: Engine, inputs: Vec<Input>, cfg: &Config, stop: &Arc<AtomicBool>, on_record: impl FnMut(Record)) -> Summary {
    run_observed(engine, inputs, cfg, stop, &mut OnRecord(on_record))
}

/// [`run`], reporting to `observer`: the records and the notices between them.
pub fn run_observed(engine: Engine, inputs: Vec<Input>, cfg: &Config, stop: &Arc<AtomicBool>, observer: &mut dyn Observer) -> Summary {
    match engine {
        Engine::Local(model) => run_with(Arc::new(LocalBackend::new(model)), inputs, cfg, stop, observer),
        Engine::Remote(client) => {
            let backend = RemoteBackend::new(client, &cfg.plan.infer, cfg.plan.fit, cfg.in_flight);
            run_with(Arc::new(backend), inputs, cfg, stop, observer)
        }
        Engine::Pool(pool) => run_with(Arc::new(PoolBackend::new(pool, &cfg.plan.infer, cfg.plan.fit)), inputs, cfg, stop, observer),
    }
}

/// A photo on its way through the stages, with what its stage made of it.
pub(super) struct InFlight<T> {
    pub(super) photo: Photo,
    pub(super) work: T,
}

/// What the stages after decode keep of a photo.
pub(super) struct Photo {
    input: Input,
    /// The photo, kept for the outputs that are coloured by it.
    image: Option<RgbImage>,
    size: (usize, usize),
    timings: Timings,
    warning: Option<String>,
    known_fov: Option<crate::image_io::KnownFov>,
    exif_unreadable: Option<String>,
}

/// Staged photos kept for the forward-only comparison of `--stats`.
const STATS_SAMPLES: usize = 8;

/// [`run`] on any backend.
pub fn run_with<B: Backend + 'static>(backend: Arc<B>, inputs: Vec<Input>, cfg: &Config, stop: &Arc<AtomicBool>, observer: &mut dyn Observer) -> Summary {
    install_panic_hook();
    let started = Instant::now();
    let jobs = cfg.jobs.max(1);
    let shared = Arc::new(Shared {
        halt: AtomicBool::new(false),
        stop: stop.clone(),
        samples: cfg.stats.then(Mutex::default),
        more: AtomicUsize::new(0),
        smoother: match (cfg.video_scale, cfg.video_fov) {
            (Some(tau), _) => Some(ScaleSmoother::new(tau)),
            (None, Some(_)) => Some(ScaleSmoother::ordering()),
            (None, None) => None,
        },
        fov_smoother: cfg.video_fov.map(ScaleSmoother::new),
        depth_videos: (cfg.videos && cfg.outputs.wants(outputs::Format::Mp4)).then(DepthVideos::default),
        video_errors: AtomicUsize::new(0),
        notices: Mutex::default(),
        matrix_noted: AtomicBool::new(false),
    });
    let (plan, sha) = (cfg.effective_plan(), OnceLock::new());
    let mut summary = Summary { total: inputs.len(), ..Default::default() };

    let (job_tx, job_rx) = bounded::<Input>(jobs);
    let (answers_tx, answers_rx) = bounded::<InFlight<B::Answer>>(jobs);
    let (rec_tx, rec_rx) = if cfg.keep_predictions { bounded::<Record>(jobs) } else { unbounded::<Record>() };
    let middle = spawn_middle(&backend, &shared, answers_tx, rec_tx.clone());
    std::thread::scope(|s| {
        let (backend, shared, plan, sha, middle) = (&*backend, &*shared, &plan, &sha, &middle);
        // The digest of a large checkpoint takes seconds: start it at once, off the path.
        if cfg.outputs.wants_sidecar() {
            s.spawn(move || {
                yield_to_device(backend);
                sha.get_or_init(|| backend.weights_digest(&cfg.weights));
            });
        }
        let rec = rec_tx.clone();
        s.spawn(move || feed(backend, cfg, shared, inputs, job_tx, rec));
        let decoders: Vec<_> = (0..jobs)
            .map(|_| {
                let (jobs, rec) = (job_rx.clone(), rec_tx.clone());
                s.spawn(move || decode_stage(backend, cfg, plan, shared, jobs, middle, rec))
            })
            .collect();
        drop(job_rx);
        // Once every decoder is done, the middle stage finishes and lets the encoders end.
        s.spawn(move || {
            for d in decoders {
                let _ = d.join();
            }
            middle.close();
        });
        for _ in 0..jobs {
            let (answers, rec) = (answers_rx.clone(), rec_tx.clone());
            s.spawn(move || encode_stage(backend, cfg, plan, shared, sha, answers, rec));
        }
        drop((answers_rx, rec_tx));
        collect(&mut summary, rec_rx, shared, observer);
    });
    summary.interrupted = stop.load(Ordering::Relaxed);
    if let Some(d) = &shared.depth_videos {
        for path in d.abandon() {
            if !shared.halted() {
                shared.video_error(Some(format!("{}: not written: some of the video's frames never came", path.display())));
            }
        }
        pass_notices(&mut summary, &shared, observer);
    }
    // A depth video not written is a failed output of its video.
    let video_errors = shared.video_errors.load(Ordering::Relaxed);
    (summary.failed, summary.total) = (summary.failed + video_errors, summary.total + video_errors);
    // Once per run rather than per file (see `outputs::sync_written`); a failure here is a
    // failure of the run: outputs reported as written may not be on disk.
    if let Err(e) = outputs::sync_written() {
        summary.fatal.get_or_insert_with(|| crate::console::error_line(&e));
    }
    summary.wall = started.elapsed();
    if let (Some(samples), false) = (&shared.samples, summary.interrupted) {
        let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
        summary.forward_only = backend.forward_only(&samples);
    }
    summary
}

/// Hands the inputs to the decoders, answering at once for those that need no work; a video's
/// frames are handed on one by one as ffmpeg decodes them.
fn feed<B: Backend>(backend: &B, cfg: &Config, shared: &Shared<B::Job>, inputs: Vec<Input>, jobs: Sender<Input>, records: Sender<Record>) {
    let has_normal = backend.has_normal();
    // False once the decoders are gone.
    let hand_on = |input: Input| -> bool {
        let planned = outputs::planned_paths(&cfg.stem(&input), &cfg.outputs, has_normal);
        if cfg.skip_existing && !planned.is_empty() && planned.iter().all(|p| p.exists()) {
            shared.smoothing(&input, |s, video, seq| {
                s.pass(video, seq);
                s.resolve(video, seq, None);
            });
            shared.fov_resolve(&input, None);
            if let (Some(d), Some(frame)) = (&shared.depth_videos, &input.frame) {
                shared.video_error(d.put_done(input.index, frame.seq, done_depth(cfg, &input)));
            }
            let _ = records.send(Record::skipped(&input, planned));
            return true;
        }
        jobs.send(input).is_ok()
    };
    for (index, mut input) in inputs.into_iter().enumerate() {
        if shared.halted() {
            break;
        }
        input.index = index;
        if let Some(p) = &input.problem {
            let _ = records.send(Record::failed(&input, &anyhow!("{p}"), Timings::default()));
            continue;
        }
        let more = match input.is_video() {
            true if cfg.videos => feed_video(cfg, shared, &input, &records, &hand_on),
            true => {
                let e = anyhow!("a video: `moge batch` reads videos frame by frame");
                records.send(Record::failed(&input, &e, Timings::default())).is_ok()
            }
            false => hand_on(input),
        };
        if !more {
            break;
        }
    }
}

/// One decode thread: photos from the feeder, staged, into the middle stage's queue.
fn decode_stage<B: Backend>(
    backend: &B,
    cfg: &Config,
    plan: &Plan,
    shared: &Shared<B::Job>,
    jobs: Receiver<Input>,
    middle: &Worker<InFlight<B::Job>>,
    records: Sender<Record>,
) {
    yield_to_device(backend);
    for input in jobs {
        if shared.halted() {
            continue; // drain: dropped, never started
        }
        let decoded = guarded(|| decode(backend, cfg, plan, &input));
        // Said once: the view is not worked out again after that.
        if !shared.matrix_noted.load(Ordering::Relaxed) {
            if let Some(note) = decoded.as_ref().ok().and_then(|item| view_note(&item.photo)) {
                if !shared.matrix_noted.swap(true, Ordering::Relaxed) {
                    shared.notice(Notice::Info(note));
                }
            }
        }
        // A video's frames go to the middle stage in their order where their scales are smoothed.
        let mut turn = true;
        shared.smoothing(&input, |s, video, seq| turn = s.wait_turn(video, seq, &|| shared.halted()));
        let submitted = match decoded {
            Ok(item) => turn && middle.submit(item).is_ok(),
            Err(e) => {
                shared.frame_missing(&input);
                let _ = records.send(Record::failed(&input, &e, Timings::default()));
                true
            }
        };
        shared.smoothing(&input, |s, video, seq| s.pass(video, seq));
        if !submitted {
            break;
        }
    }
}

/// What a person should know of a known camera whose photo runs in a larger view (see
/// `crate::camera`): the view's share of the tokens that the photo gets.
fn view_note(photo: &Photo) -> Option<String> {
    let camera = photo.known_fov.as_ref()?.camera?;
    let (w, h) = (photo.size.0 as u32, photo.size.1 as u32);
    if camera.is_centred(w, h) {
        return None;
    }
    let view = camera.view(w, h, None, u64::MAX).ok()?;
    let share = (w as f64 * view.scale.0 * h as f64 * view.scale.1) / (view.width * view.height) as f64;
    Some(format!(
        "note: the camera ({camera}) is not centred with square pixels: a {w}x{h} photo runs in a {}x{} view with the principal point at its centre, and gets {:.0}% of its tokens",
        view.width,
        view.height,
        100.0 * share
    ))
}

pub(super) fn decode<B: Backend>(backend: &B, cfg: &Config, plan: &Plan, input: &Input) -> Result<InFlight<B::Job>> {
    let s = backend.stage(input, plan, &cfg.decode_options())?;
    // A video's frame was decoded by ffmpeg as the feeder waited for it.
    let read = input.frame.as_ref().map_or(0.0, |f| f.read_ms);
    let timings = Timings { decode: s.decode_ms + read, prepare: s.prepare_ms, ..Default::default() };
    let size = (s.photo.width() as usize, s.photo.height() as usize);
    let image = cfg.outputs.needs_image().then_some(s.photo);
    let warning = s.warning.map(|w| format!("{}: {w}", input.name()));
    Ok(InFlight {
        photo: Photo { input: input.clone(), image, size, timings, warning, known_fov: s.known_fov, exif_unreadable: s.exif_unreadable },
        work: s.job,
    })
}

/// The middle stage: the backend's lanes over a bounded queue. What is queued once the run
/// has halted is dropped ("not started").
fn spawn_middle<B: Backend + 'static>(
    backend: &Arc<B>,
    shared: &Arc<Shared<B::Job>>,
    answers: Sender<InFlight<B::Answer>>,
    records: Sender<Record>,
) -> Worker<InFlight<B::Job>> {
    let (backend, shared) = (backend.clone(), shared.clone());
    Worker::spawn("moge-forward", backend.lanes(), backend.queue(), move |InFlight { mut photo, work }: InFlight<B::Job>| {
        if shared.halted() {
            // Dropped: a later frame already through may wait for this one.
            shared.frame_missing(&photo.input);
            return;
        }
        if let Some(samples) = &shared.samples {
            let mut kept = samples.lock().unwrap_or_else(|e| e.into_inner());
            if kept.len() < STATS_SAMPLES {
                kept.extend(backend.sample(&work));
            }
        }
        let t = Instant::now();
        let result = guarded(|| backend.forward(work));
        // Before the frame goes on: an encode thread may be waiting for this scale.
        shared.smoothing(&photo.input, |s, video, seq| {
            let scale = result.as_ref().ok().and_then(|out| backend.metric_scale(out)).filter(|v| v.is_finite() && *v > 0.0);
            s.resolve(video, seq, scale.map(|scale| Raw { scale, time: photo.input.frame.as_ref().and_then(|f| f.time) }));
        });
        match result {
            Ok(out) => {
                photo.timings.forward = ms(t);
                let _ = answers.send(InFlight { photo, work: out });
            }
            Err(e) => {
                shared.to_depth_video(&photo.input, None);
                shared.fov_resolve(&photo.input, None);
                let mut rec = Record::failed(&photo.input, &e, photo.timings);
                rec.fatal |= backend.is_fatal(&e);
                let _ = records.send(rec);
            }
        }
    })
}

/// One encode thread: post-processes and writes what the middle stage hands on.
fn encode_stage<B: Backend>(
    backend: &B,
    cfg: &Config,
    plan: &Plan,
    shared: &Shared<B::Job>,
    sha: &OnceLock<String>,
    answers: Receiver<InFlight<B::Answer>>,
    records: Sender<Record>,
) {
    yield_to_device(backend);
    for item in answers {
        let (input, timings) = (item.photo.input.clone(), item.photo.timings.clone());
        let rec = guarded(|| encode(backend, cfg, plan, Some(shared), sha, item)).unwrap_or_else(|e| {
            // A frame that failed before its own field of view went into the estimate (a
            // panic in its solve): the frames after it do not wait for it.
            shared.fov_resolve(&input, None);
            shared.to_depth_video(&input, None);
            Record::failed(&input, &e, timings)
        });
        let _ = records.send(rec);
    }
}

pub(super) fn encode<B: Backend>(
    backend: &B,
    cfg: &Config,
    plan: &Plan,
    shared: Option<&Shared<B::Job>>,
    sha: &OnceLock<String>,
    item: InFlight<B::Answer>,
) -> Result<Record> {
    let InFlight { photo, work } = item;
    let mut timings = photo.timings.clone();
    // `--video-scale smooth`: the frame at the running estimate of its video's scale. Every
    // frame before this one is in the middle stage or past it, so the wait ends; after a stop,
    // a minute's grace bounds it all the same.
    let mut smoothed = Some(None);
    if let Some(shared) = shared {
        let since = Instant::now();
        let given_up = || shared.halted() && since.elapsed() > std::time::Duration::from_secs(60);
        shared.smoothing(&photo.input, |s, video, seq| smoothed = s.smoothed(video, seq, &given_up));
    }
    let Some(smoothed) = smoothed else {
        anyhow::bail!("not written: the run stopped before the frames before it were done, which its smoothed scale needs");
    };
    // Without --video-scale smooth the smoother only kept the frames in order.
    let smoothed = smoothed.filter(|_| cfg.video_scale.is_some());
    let t = Instant::now();
    let (mut finished, fov_raw) = match shared.filter(|s| s.fov_smoother.is_some() && photo.input.frame.is_some()) {
        Some(shared) => finish_fov_smoothed(backend, shared, &photo.input, work, photo.size, plan)?,
        None => (backend.finish(work, photo.size, plan)?, None),
    };
    let mut raw_scale = None;
    if let Some(v) = smoothed.or(photo.input.shared.as_ref().and_then(|s| s.metric_scale)) {
        raw_scale = Some(finished.pred.metric_scale);
        finished.pred.rescale(v);
    }
    let post = match &cfg.post {
        Some(post) => Some(post.apply(&photo.input, &mut finished.pred, &cfg.stem(&photo.input))?),
        None => None,
    };
    let stats = DepthStats::of(&finished.pred);
    timings.postprocess = ms(t);
    // Everything from here is the write stage, the sidecar's assembly included.
    let t = Instant::now();
    let mut sidecar = cfg.outputs.wants_sidecar().then(|| {
        let model = ModelInfo { id: backend.model_id(&cfg.model_id), weights_sha256: sha.get_or_init(|| backend.weights_digest(&cfg.weights)).clone() };
        let inference = cfg.inference_info(
            photo.known_fov.as_ref(),
            photo.exif_unreadable.as_deref(),
            finished.device,
            finished.num_tokens,
            finished.grid,
            finished.server,
        );
        let input = photo.input.path.display().to_string();
        let mut s = Sidecar::new(input, &finished.pred, stats.clone(), cfg.outputs.depth_png_scale, model, inference, timings.clone());
        s.frame = photo.input.frame.as_ref().map(|f| FrameInfo { index: f.index, time_s: f.time, metric_scale_raw: raw_scale, fov_x_raw: fov_raw });
        if fov_raw.is_some() {
            s.inference.fov_x_given = Some(s.fov_x);
            s.inference.fov_x_source = "smoothed: the running estimate over the video's frames (--video-fov smooth)".into();
        }
        if let Some(shared) = &photo.input.shared {
            let mut v = serde_json::to_value(&**shared).unwrap_or_default();
            v["metric_scale_own"] = raw_scale.into();
            s.extra.insert("shared_camera".into(), v);
        }
        if let Some((key, value)) = post.as_ref().and_then(|p| p.sidecar.clone()) {
            s.extra.insert(key.into(), value);
        }
        s
    });
    let pred = finished.pred;
    // A frame is named as ffmpeg would extract it (`000012.png`).
    let name = match &photo.input.frame {
        Some(f) => format!("{:06}.png", f.index),
        None => photo.input.path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
    };
    let mut written = outputs::write_all(&cfg.stem(&photo.input), &pred, photo.image.as_ref(), &name, &cfg.outputs, sidecar.as_mut())?;
    if let Some(p) = post {
        written.extend(p.files);
    }
    let saturated = match &sidecar {
        Some(s) if cfg.outputs.wants(outputs::Format::Png) => s.depth_png.saturated,
        _ => 0,
    };
    timings.write = Some(ms(t));
    if let Some(shared) = shared {
        shared.to_depth_video(&photo.input, Some((pred.width, pred.height, pred.depth.clone())));
    }
    Ok(Record {
        outputs: written,
        saturated,
        summary: Some(pred.summary_with_median(stats.median.unwrap_or(f32::NAN))),
        warning: photo.warning,
        prediction: cfg.keep_predictions.then(|| Box::new(pred)),
        ..Record::new(&photo.input, Status::Ok, vec![], timings)
    })
}

/// A frame's prediction at its video's running estimate of the field of view: solved for its
/// own first, which goes into the estimate, then again with the estimate over the frames up to
/// it; with the frame's own field of view where it was replaced.
fn finish_fov_smoothed<B: Backend>(
    backend: &B,
    shared: &Shared<B::Job>,
    input: &Input,
    work: B::Answer,
    size: (usize, usize),
    plan: &Plan,
) -> Result<(super::backend::Finished, Option<f32>)> {
    let (Some(smoother), Some(frame)) = (&shared.fov_smoother, &input.frame) else { return Ok((backend.finish(work, size, plan)?, None)) };
    let own = match backend.finish_again(&work, size, plan, None) {
        Some(Ok(f)) => f,
        other => {
            shared.fov_resolve(input, None);
            return match other {
                Some(Err(e)) => Err(e),
                _ => Ok((backend.finish(work, size, plan)?, None)),
            };
        }
    };
    let own_fov = own.pred.fov_degrees().0;
    let tan = (own_fov.to_radians() / 2.0).tan();
    shared.fov_resolve(input, Some(tan).filter(|t| t.is_finite() && *t > 0.0));
    let since = Instant::now();
    let given_up = || shared.halted() && since.elapsed() > std::time::Duration::from_secs(60);
    match smoother.smoothed(input.index, frame.seq, &given_up) {
        None => anyhow::bail!("not written: the run stopped before the frames before it were done, which its smoothed field of view needs"),
        Some(Some(t)) => {
            let fov = (2.0 * t.atan()).to_degrees();
            match backend.finish_again(&work, size, plan, Some(fov)) {
                Some(again) => Ok((again?, Some(own_fov))),
                None => Ok((own, None)),
            }
        }
        Some(None) => Ok((own, None)),
    }
}

/// The collector (the calling thread): counts each record and passes it on, with the notices
/// the stages left before it.
fn collect<S>(summary: &mut Summary, records: Receiver<Record>, shared: &Shared<S>, observer: &mut dyn Observer) {
    let listed = summary.total;
    for rec in records {
        pass_notices(summary, shared, observer);
        // A video's frames are counted as they are read.
        summary.total = listed + shared.more.load(Ordering::Relaxed);
        match rec.status {
            Status::Ok => summary.done += 1,
            Status::Failed => summary.failed += 1,
            Status::Skipped => summary.skipped += 1,
        }
        summary.depth_png_saturated += rec.saturated;
        if rec.status == Status::Ok {
            summary.stages.add(&rec.timings);
        }
        if let Some(err) = rec.error.as_ref().filter(|_| rec.fatal && summary.fatal.is_none()) {
            summary.fatal = Some(err.clone());
            shared.halt.store(true, Ordering::Relaxed);
        }
        observer.record(rec, summary);
    }
    pass_notices(summary, shared, observer);
    summary.total = listed + shared.more.load(Ordering::Relaxed);
    observer.records_done();
}

/// Hands on the notices waiting in `shared`, keeping them in the summary.
fn pass_notices<S>(summary: &mut Summary, shared: &Shared<S>, observer: &mut dyn Observer) {
    let waiting = std::mem::take(&mut *shared.notices.lock().unwrap_or_else(|e| e.into_inner()));
    for n in waiting {
        observer.notice(&n);
        summary.notices.push(n);
    }
}

/// Where the forward runs on this machine's cores, the host stages run at the lowest priority:
/// they fill the forward's gaps (its serial parts, the ends of parallel loops) instead of
/// taking turns with its threads, yet never starve when other processes load the machine.
/// `moge batch --stats`, ViT-S bf16, 12 photos, npz: batch / forward-only 95.1 / 94.4 % → 97.2 /
/// 96.9 % (PERFORMANCE.md step 11).
fn yield_to_device(backend: &impl Backend) {
    #[cfg(target_os = "linux")]
    if backend.shares_cpu() {
        // SAFETY: gettid and setpriority take no pointers; Linux applies PRIO_PROCESS with a
        // thread id to that thread alone. A failure only costs speed.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, 19);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = backend;
}
