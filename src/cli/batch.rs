//! `moge batch DIR... -o OUT`: every photo under the directories through the streaming
//! pipeline, outputs in a mirrored tree.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;

use super::report::{self, Reporter};
use super::values::FitArg;
use super::{InferArgs, InputArgs, ModelArgs, OutputArgs, RemoteArgs, EXIT_FATAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_SOME_FAILED};
use moge::fit::{Canvas, FitMode};
use moge::pipeline::inputs::{self, Shard};
use moge::pipeline::run::{self, Config};

#[derive(Args, Debug)]
#[command(after_help = "Exit status: 0 all done, 1 some inputs failed, 2 usage or fatal error, 130 interrupted.")]
pub struct BatchArgs {
    /// Directories (searched recursively for jpg, jpeg, png, webp, bmp, tif, tiff and videos;
    /// hidden files and directories skipped), image files or videos (mp4, mov, mkv, webm, avi,
    /// ...: decoded by ffmpeg, each frame's outputs in a folder named after the video:
    /// clip.mp4 gives OUT/clip/000000.npz, ...). HEIC/HEIF and AVIF photos are found too:
    /// decoded in a build with the `heif` feature, else each fails saying what to do.
    #[arg(value_name = "DIR", required_unless_present = "from_list")]
    pub inputs: Vec<PathBuf>,
    /// Also read image paths from FILE, one per line ('-' for stdin; '#' starts a comment).
    #[arg(long, value_name = "FILE")]
    pub from_list: Option<PathBuf>,
    /// Output directory: DIR/sub/x.jpg gives OUT/sub/x.<kind>.
    #[arg(short, long, value_name = "OUT")]
    pub output: PathBuf,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub infer: InferArgs,
    #[command(flatten)]
    pub out: OutputArgs,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub remote: RemoteArgs,
    #[command(flatten)]
    pub video: VideoArgs,
    #[command(flatten)]
    pub camera: CameraArgs,
    /// How photos meet the network: at their own aspect, or padded / stretched onto --canvas
    /// (one token grid for every photo); outputs always have the photo's size.
    #[arg(long, value_enum, default_value_t = FitMode::Exact.into())]
    pub fit: FitArg,
    /// The canvas of --fit pad / stretch.
    #[arg(long, value_name = "WxH", default_value = "1920x1080")]
    pub canvas: Canvas,
    /// Host threads for each host stage (decode, post-process and write); default: the number of CPUs, at most 8.
    #[arg(short, long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: Option<u32>,
    /// Process only shard I of N (0-based; each photo belongs to exactly one shard, by a hash
    /// of its output path). auto: the shard of this task of a Slurm job array
    /// (SLURM_ARRAY_TASK_ID, _MIN and _COUNT) or a Kubernetes indexed Job (JOB_COMPLETION_INDEX,
    /// of N with auto/N, or of JOB_COMPLETIONS).
    #[arg(long, value_name = "I/N|auto[/N]")]
    pub shard: Option<Shard>,
    /// Skip photos whose requested outputs all exist (resume an interrupted run).
    #[arg(long)]
    pub skip_existing: bool,
    /// No progress bar and no summary (errors are still printed).
    #[arg(short, long)]
    pub quiet: bool,
    /// Print one JSON line per photo on stdout: input, status, outputs, timings, error.
    #[arg(long)]
    pub json: bool,
    /// Print where the time goes per stage, and throughput against forwards alone.
    #[arg(long)]
    pub stats: bool,
    /// Every input is a 360° equirectangular panorama: `moge panorama`'s work and outputs, with
    /// this command's listing, --shard, --skip-existing and --json.
    #[arg(long, help_heading = "Panoramas")]
    pub panorama: bool,
    /// With --panorama: each of the twelve views' size in pixels (upstream's: 512).
    #[arg(long, value_name = "PX", requires = "panorama", help_heading = "Panoramas",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(64..=4096))]
    pub view_size: Option<usize>,
}

/// `batch --panorama` as `moge panorama`'s arguments; what only photos and videos take is
/// refused rather than ignored.
fn panorama_args(a: BatchArgs) -> Result<super::panorama::PanoramaArgs> {
    let refuse = |what: &str, why: &str| anyhow::bail!("{what} does not apply to --panorama: {why}");
    if FitMode::from(a.fit) != FitMode::Exact || a.canvas != Canvas::FULL_HD {
        refuse("--fit / --canvas", "a panorama's views have their own size (--view-size)")?;
    }
    if a.camera.camera != CameraArg::PerPhoto || a.camera.shared_scale {
        refuse("--camera shared / --shared-scale", "a panorama's views are 90° each")?;
    }
    if a.video.every.is_some() || a.video.fps.is_some() || a.video.video_scale.0.is_some() || a.video.video_fov != VideoFov::Raw {
        refuse("--every / --fps / --video-scale / --video-fov", "they are for videos")?;
    }
    if a.jobs.is_some() || a.stats {
        refuse("--jobs / --stats", "a panorama's twelve views go through the model one after another")?;
    }
    let mut servers = a.remote.server;
    if servers.len() > 1 {
        refuse("more than one --server", "a panorama's views go to one server")?;
    }
    Ok(super::panorama::PanoramaArgs {
        inputs: a.inputs,
        from_list: a.from_list,
        output: a.output,
        view_size: a.view_size.unwrap_or(moge::panorama::VIEW_SIZE),
        server: servers.pop(),
        json: a.json,
        quiet: a.quiet,
        shard: a.shard,
        skip_existing: a.skip_existing,
        model: a.model,
        infer: a.infer,
        out: a.out,
        input: a.input,
    })
}

/// Which frames of a video are taken.
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Videos")]
pub struct VideoArgs {
    /// Take every Nth frame of each video, from the first (frames keep their numbers in the
    /// video: --every 10 gives 000000, 000010, ...).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "fps")]
    pub every: Option<u64>,
    /// Take at most F frames per second of each video's time: the first frame at or after each
    /// 1/F s.
    #[arg(long, value_name = "F", value_parser = super::parse_positive)]
    pub fps: Option<f32>,
    /// Each frame's metric scale: raw (the frame's own estimate, which flickers from frame to
    /// frame) or smooth (a running estimate over the frames before it, in log scale, with a
    /// time constant of 1 s, or T seconds with smooth=T; the sidecar keeps the frame's own in
    /// frame.metric_scale_raw).
    #[arg(long, value_name = "raw|smooth[=T]", default_value = "raw", value_parser = parse_video_scale)]
    pub video_scale: VideoScale,
    /// Each frame's field of view: raw (the frame's own estimate), shared (one for the whole
    /// video: the median over its first --camera-sample frames taken; as --camera shared, for
    /// videos only) or smooth (a running estimate over the frames up to it, of log tan(fov/2),
    /// with a time constant of 1 s or T seconds with smooth=T; each frame is solved twice, a
    /// model run here only; the sidecar keeps the frame's own in frame.fov_x_raw).
    #[arg(long, value_name = "raw|shared|smooth[=T]", default_value = "raw", value_parser = parse_video_fov)]
    pub video_fov: VideoFov,
}

/// `--video-fov`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum VideoFov {
    #[default]
    Raw,
    Shared,
    /// The time constant, seconds.
    Smooth(f64),
}

fn parse_video_fov(s: &str) -> Result<VideoFov, String> {
    match s {
        "raw" => Ok(VideoFov::Raw),
        "shared" => Ok(VideoFov::Shared),
        _ => match parse_video_scale(s) {
            Ok(VideoScale(Some(t))) => Ok(VideoFov::Smooth(t)),
            _ => Err(format!("'{s}' is not raw, shared, smooth or smooth=SECONDS")),
        },
    }
}

/// `--camera`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CameraArg {
    /// Each photo's field of view its own (estimated, or as given).
    PerPhoto,
    /// One field of view per folder of photos and per video: the median over a first pass.
    Shared,
}

/// One camera for many photos.
#[derive(Args, Debug)]
#[command(next_help_heading = "One camera for many photos")]
pub struct CameraArgs {
    /// per-photo, or shared: the photos of each folder (the frames of each video) were taken by
    /// one camera at one zoom; a first pass runs the model on --camera-sample of them (spread
    /// evenly over the folder's sorted list; a video's first frames taken) and every photo of
    /// the group then gets the median field of view (the sidecar's shared_camera says which).
    #[arg(long, value_enum, value_name = "per-photo|shared", default_value = "per-photo", conflicts_with_all = ["fov_x", "intrinsics", "intrinsics_from"])]
    pub camera: CameraArg,
    /// Photos (frames) per folder (video) in the first pass of --camera shared / --video-fov shared.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub camera_sample: u64,
    /// With --camera shared or --video-fov shared, share the metric scale too (the median of the
    /// first pass; the sidecar keeps each photo's own as shared_camera.metric_scale_own).
    #[arg(long)]
    pub shared_scale: bool,
}

/// `--video-scale`: the time constant of the smoothing, if any.
#[derive(Debug, Clone, Copy, Default)]
pub struct VideoScale(pub Option<f64>);

fn parse_video_scale(s: &str) -> Result<VideoScale, String> {
    match s.split_once('=') {
        None if s == "raw" => Ok(VideoScale(None)),
        None if s == "smooth" => Ok(VideoScale(Some(1.0))),
        Some(("smooth", t)) => match t.trim().parse::<f64>() {
            Ok(t) if t.is_finite() && t > 0.0 => Ok(VideoScale(Some(t))),
            _ => Err(format!("'{t}' is not a time constant in seconds (a positive number)")),
        },
        _ => Err(format!("'{s}' is not raw, smooth or smooth=SECONDS")),
    }
}

impl VideoArgs {
    pub fn sampling(&self) -> moge::image_io::video::Sampling {
        moge::image_io::video::Sampling { every: self.every.unwrap_or(1), fps: self.fps.map(f64::from), first: None }
    }
}

/// Ctrl-C (or SIGTERM) once: stop taking new photos and finish the ones in progress. Twice:
/// remove the temporary files of writes in progress and exit at once. Both exit 130.
pub(super) fn install_signals(stop: Arc<AtomicBool>) {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        moge::errln!("moge: warning: cannot install the Ctrl-C handler");
        return;
    };
    let count = AtomicUsize::new(0);
    std::thread::spawn(move || {
        for _ in signals.forever() {
            if count.fetch_add(1, Ordering::SeqCst) == 0 {
                stop.store(true, Ordering::SeqCst);
                moge::errln!("moge: interrupted: finishing the photos in progress (press Ctrl-C again to abandon them)");
            } else {
                moge::outputs::remove_pending_temp_files();
                moge::errln!("moge: interrupted");
                std::process::exit(EXIT_INTERRUPTED);
            }
        }
    });
}

/// How photos share a camera, if they do.
fn sharing(args: &BatchArgs) -> Result<Option<moge::pipeline::shared_camera::Sharing>> {
    if let VideoFov::Smooth(_) = args.video.video_fov {
        if !args.remote.server.is_empty() {
            anyhow::bail!("--video-fov smooth solves each frame again with the estimate, which a server's answer does not allow: use shared, or a model here");
        }
        if args.infer.fov_x.is_some() || args.infer.intrinsics.is_some() || args.infer.intrinsics_from.is_some() || args.camera.camera == CameraArg::Shared {
            anyhow::bail!("--video-fov smooth estimates the field of view: not with --fov-x, --intrinsics, --intrinsics-from or --camera shared");
        }
    }
    let (photos, videos) = (args.camera.camera == CameraArg::Shared, args.video.video_fov == VideoFov::Shared);
    if !(photos || videos) {
        if args.camera.shared_scale {
            anyhow::bail!("--shared-scale shares the metric scale of --camera shared or --video-fov shared: give one of them");
        }
        return Ok(None);
    }
    if args.camera.shared_scale && args.video.video_scale.0.is_some() {
        anyhow::bail!("--shared-scale and --video-scale smooth each set the frames' scale: choose one");
    }
    if videos && (args.infer.fov_x.is_some() || args.infer.intrinsics.is_some() || args.infer.intrinsics_from.is_some()) {
        anyhow::bail!("--video-fov shared estimates the field of view: not with --fov-x, --intrinsics or --intrinsics-from");
    }
    Ok(Some(moge::pipeline::shared_camera::Sharing { sample: args.camera.camera_sample as usize, scale: args.camera.shared_scale, videos_only: !photos }))
}

/// What a run whose shard holds none of the `total` inputs says (it exits 0).
pub(super) fn say_none_in_shard(shard: Option<Shard>, total: usize, what: &str) {
    let s = shard.map(|s| format!("shard {}/{}", s.index, s.count)).unwrap_or_default();
    moge::errln!("moge: {s} has none of the {total} {what}");
}

/// Creates `dir` and checks that a file can be written there.
pub fn check_output_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create the output directory", dir.display()))?;
    let probe = dir.join(format!(".moge-probe-{}", std::process::id()));
    std::fs::File::create(&probe)
        .and_then(|mut f| f.write_all(b"probe"))
        .with_context(|| format!("{}: the output directory is not writable", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

pub fn run(args: BatchArgs) -> Result<i32> {
    if args.panorama {
        return super::panorama::run(panorama_args(args)?);
    }
    let share = sharing(&args)?;
    let (mut inputs, total) = inputs::collect(&args.inputs, args.from_list.as_deref(), args.shard, &args.output, &report::print_notice)?;
    args.infer.attach_cameras(&mut inputs)?;
    if inputs.is_empty() {
        if !args.quiet {
            say_none_in_shard(args.shard, total, "images");
        }
        return Ok(EXIT_OK);
    }
    check_output_dir(&args.output)?;
    let (weights, engine) = args.remote.engine(&args.model, &args.infer)?;
    let base = super::pipeline_config(&args.output, &args.model, weights, &args.infer, args.out.options(), &args.input);
    let cfg = Config {
        plan: moge::Plan { fit: args.fit.into(), canvas: args.canvas, ..base.plan },
        in_flight: args.remote.in_flight as usize,
        jobs: args.jobs.map(|j| j as usize).unwrap_or_else(run::default_jobs),
        skip_existing: args.skip_existing,
        videos: true,
        frames: args.video.sampling(),
        video_scale: args.video.video_scale.0,
        video_fov: match args.video.video_fov {
            VideoFov::Smooth(t) => Some(t),
            _ => None,
        },
        stats: args.stats,
        ..base
    };
    let stop = Arc::new(AtomicBool::new(false));
    install_signals(stop.clone());
    if let Some(sharing) = share {
        let cameras = moge::pipeline::shared_camera::estimate(engine.clone(), &inputs, &cfg, sharing, &stop);
        if !args.quiet {
            for c in cameras.values() {
                let scale = c.metric_scale.map_or(String::new(), |s| format!(", metric scale {s:.4}"));
                moge::errln!(
                    "moge: one camera for {}: fov_x {:.2}° (the median of {} estimates, {:.2}..{:.2}){scale}",
                    c.group.display(),
                    c.fov_x,
                    c.sampled,
                    c.fov_x_range.0,
                    c.fov_x_range.1
                );
            }
        }
        moge::pipeline::shared_camera::attach(&mut inputs, &cameras, sharing);
    }
    let mut reporter = Reporter::new(!args.quiet, inputs.len(), args.json, |_: &moge::Record| {});
    let summary = run::run_observed(engine, inputs, &cfg, &stop, &mut reporter);
    if !args.quiet || args.stats {
        moge::errln!("{}", report::report(&summary, cfg.jobs, cfg.stats));
    }
    if let Some(f) = &summary.fatal {
        moge::errln!("moge: stopped: {f}");
        return Ok(EXIT_FATAL);
    }
    if summary.interrupted {
        moge::errln!("moge: interrupted; run again with --skip-existing to do the rest");
        return Ok(EXIT_INTERRUPTED);
    }
    Ok(if summary.failed > 0 { EXIT_SOME_FAILED } else { EXIT_OK })
}
