//! `moge panorama PANORAMA... -o DIR`: 360° equirectangular photos, as upstream's
//! `moge infer_panorama`, with the metric scale kept (see `moge::panorama`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;

use super::{report, InferArgs, InputArgs, ModelArgs, OutputArgs, EXIT_INTERRUPTED, EXIT_OK, EXIT_SOME_FAILED};
use moge::image_io::FovFrom;
use moge::outputs::Format;
use moge::pipeline::inputs::{self, Shard};
use moge::Predictor;

#[derive(Args, Debug)]
#[command(after_help = "Exit status: 0 all done, 1 some inputs failed, 2 usage or fatal error, 130 interrupted.")]
pub struct PanoramaArgs {
    /// Equirectangular panoramas (twice as wide as high), or directories of them.
    #[arg(value_name = "PANORAMA", required_unless_present = "from_list")]
    pub inputs: Vec<PathBuf>,
    /// Also read panorama paths from FILE, one per line ('-' for stdin; '#' starts a comment).
    #[arg(long, value_name = "FILE")]
    pub from_list: Option<PathBuf>,
    /// Output directory: PANORAMA's stem + .npz (and the other formats' suffixes) goes here,
    /// a directory's tree mirrored.
    #[arg(short, long, value_name = "DIR", default_value = "output")]
    pub output: PathBuf,
    /// Each of the twelve views' size in pixels (upstream's: 512).
    #[arg(long, value_name = "PX", default_value_t = moge::panorama::VIEW_SIZE, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(64..=4096))]
    pub view_size: usize,
    /// A running `moge serve` that runs the views instead of a model loaded here.
    #[arg(long, value_name = "URL", conflicts_with_all = ["weights", "precision", "device"])]
    pub server: Option<String>,
    /// One JSON line per panorama on stdout instead of a sentence.
    #[arg(long)]
    pub json: bool,
    /// No line per panorama (errors are still printed).
    #[arg(short, long, conflicts_with = "json")]
    pub quiet: bool,
    /// Process only shard I of N, as `moge batch --shard` (auto: the Slurm array task's or the
    /// Kubernetes indexed Job's).
    #[arg(long, value_name = "I/N|auto[/N]")]
    pub shard: Option<Shard>,
    /// Skip panoramas whose requested outputs all exist (resume an interrupted run).
    #[arg(long)]
    pub skip_existing: bool,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub infer: InferArgs,
    #[command(flatten)]
    pub out: OutputArgs,
    #[command(flatten)]
    pub input: InputArgs,
}

pub fn run(args: PanoramaArgs) -> Result<i32> {
    let plan = moge::Plan { infer: args.infer.options(), fov: args.infer.fov_from(), ..moge::Plan::default() };
    if plan.infer.fov_x.is_some() || plan.fov != FovFrom::Estimate || args.infer.intrinsics_from.is_some() {
        bail!("--fov-x, --intrinsics and --intrinsics-from do not apply to a panorama: its views are 90° each");
    }
    if plan.infer.per_step {
        bail!("--per-step does not apply to a panorama: its views' maps are merged");
    }
    let mut opts = args.out.options();
    opts.edge_rtol = args.out.edge_rtol.unwrap_or(moge::panorama::edges::DEFAULT_RTOL);
    if opts.wants(Format::Mp4) {
        bail!("--format mp4 is for videos");
    }
    if opts.wants(Format::Colmap) {
        bail!("--format colmap writes a pinhole camera's model: a panorama has none");
    }
    let (list, total) = inputs::collect(&args.inputs, args.from_list.as_deref(), args.shard, &args.output, &report::print_notice)?;
    if list.is_empty() {
        if !args.quiet {
            super::batch::say_none_in_shard(args.shard, total, "panoramas");
        }
        return Ok(EXIT_OK);
    }
    let suffixes = moge::outputs::panorama::suffixes(&opts);
    let predictor = match &args.server {
        Some(url) => Predictor::connect(url, moge::remote::ClientOptions::default())?,
        None => Predictor::local(Arc::new(args.model.load()?.1)),
    };
    let decode = args.input.options();
    let mut failed = 0;
    // Ctrl-C: the panorama in progress is finished, the rest left for --skip-existing.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    super::batch::install_signals(stop.clone());
    for input in &list {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            moge::errln!("moge: interrupted; run again with --skip-existing to do the rest");
            return Ok(EXIT_INTERRUPTED);
        }
        let started = Instant::now();
        let stem = args.output.join(&input.rel);
        if args.skip_existing && suffixes.iter().all(|s| moge::outputs::with_suffix(&stem, s).is_file()) {
            if args.json {
                moge::outln!("{}", serde_json::json!({ "input": input.path, "status": "skipped" }));
            } else if !args.quiet {
                moge::outln!("{}: skipped (its outputs exist)", input.path.display());
            }
            continue;
        }
        let done = (|| -> Result<_> {
            if let Some(problem) = &input.problem {
                bail!("{problem}");
            }
            let photo = moge::image_io::load_rgb_with(&input.path, &decode)?.image;
            let pano = predictor.predict_panorama(&photo, &plan, args.view_size)?;
            if let Some(dir) = stem.parent() {
                std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
            }
            let files = moge::outputs::panorama::write(&stem, &pano, &photo, &opts)?;
            moge::outputs::sync_written()?;
            Ok((pano, files))
        })();
        let (pano, files) = match done {
            Ok(v) => v,
            Err(e) => {
                moge::errln!("moge: {}: {e:#}", input.path.display());
                failed += 1;
                continue;
            }
        };
        let p = &pano.prediction;
        let median = moge::outputs::json::DepthStats::of(p).median;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        if args.json {
            let line = serde_json::json!({
                "input": input.path, "status": "ok", "width": p.width, "height": p.height,
                "metric_scale": p.metric_scale, "median_distance": median, "valid_fraction": p.valid_fraction(),
                "merge_ms": pano.merge_ms, "total_ms": ms, "outputs": names,
            });
            moge::outln!("{line}");
        } else if !args.quiet {
            let median = median.map(|m| format!("{m:.3}")).unwrap_or_else(|| "none".into());
            moge::outln!(
                "{}: {}x{} panorama, median distance {median}, metric scale {:.4}, {:.1} s (merge {:.0} ms) -> {}",
                input.path.display(),
                p.width,
                p.height,
                p.metric_scale,
                ms / 1e3,
                pano.merge_ms,
                names.join(", ")
            );
        }
    }
    Ok(if failed == 0 { EXIT_OK } else { EXIT_SOME_FAILED })
}
