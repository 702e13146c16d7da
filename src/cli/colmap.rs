//! `moge colmap SPARSE --images DIR -o OUT`: MoGe's depth for every registered image of a COLMAP
//! reconstruction, each run with its own camera and brought to the reconstruction's scale (see
//! `moge::colmap`), through the streaming pipeline.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Result};
use clap::Args;

use super::report::{self, Reporter};
use super::values::FormatArg;
use super::{InferArgs, InputArgs, ModelArgs, RemoteArgs, EXIT_FATAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_SOME_FAILED};
use moge::pipeline::run::{self, Config};

#[derive(Args, Debug)]
#[command(after_help = "Exit status: 0 all done, 1 some images failed, 2 usage or fatal error, 130 interrupted.")]
pub struct ColmapArgs {
    /// The sparse model's folder: cameras, images and points3D as .bin or .txt (e.g. sparse/0).
    #[arg(value_name = "SPARSE")]
    pub sparse: PathBuf,
    /// The folder the model's image names are relative to.
    #[arg(long, value_name = "DIR")]
    pub images: PathBuf,
    /// Output directory: depth/NAME.npy and .png, depths/NAME.png with depth_params.json (3D
    /// Gaussian Splatting's layout), normals/NAME.png, NAME.json.
    #[arg(short, long, value_name = "OUT")]
    pub output: PathBuf,
    /// Also write these per image, in the reconstruction's units (json: the sidecar, always).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "json")]
    pub format: Vec<FormatArg>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub infer: InferArgs,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Host threads for each host stage (decode, fit and write); default: the number of CPUs, at most 8.
    #[arg(short, long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: Option<u32>,
    /// No progress bar and no summary (errors are still printed).
    #[arg(short, long)]
    pub quiet: bool,
    /// Print one JSON line per image on stdout: input, status, outputs, timings, error.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ColmapArgs) -> Result<i32> {
    if args.infer.fov_x.is_some() || args.infer.intrinsics.is_some() || args.infer.intrinsics_from.is_some() {
        bail!("--fov-x, --intrinsics and --intrinsics-from do not apply to moge colmap: each image runs with its camera in the model");
    }
    let model = moge::colmap::read(&args.sparse)?;
    let (inputs, aligner) = moge::colmap::inputs(&model, &args.images, &args.output);
    if inputs.is_empty() {
        if !args.quiet {
            moge::errln!("moge: the model in {} has no registered images", args.sparse.display());
        }
        return Ok(EXIT_OK);
    }
    std::fs::create_dir_all(&args.output).map_err(|e| anyhow::anyhow!("{}: cannot create the output directory ({e})", args.output.display()))?;
    let (weights, engine) = args.remote.engine(&args.model, &args.infer)?;
    // The sidecar always; the other formats at their defaults.
    let mut formats: Vec<moge::outputs::Format> = args.format.iter().map(|&f| f.into()).collect();
    if !formats.contains(&moge::outputs::Format::Json) {
        formats.push(moge::outputs::Format::Json);
    }
    let outputs = moge::outputs::OutputOptions { formats, ..Default::default() };
    let base = super::pipeline_config(&args.output, &args.model, weights, &args.infer, outputs, &args.input);
    let aligner = Arc::new(aligner);
    let cfg = Config {
        in_flight: args.remote.in_flight as usize,
        jobs: args.jobs.map(|j| j as usize).unwrap_or_else(run::default_jobs),
        post: Some(aligner.clone()),
        ..base
    };
    let stop = Arc::new(AtomicBool::new(false));
    super::batch::install_signals(stop.clone());
    let mut reporter = Reporter::new(!args.quiet, inputs.len(), args.json, |_: &moge::Record| {});
    let summary = run::run_observed(engine, inputs, &cfg, &stop, &mut reporter);
    let params = aligner.write_depth_params()?;
    if !args.quiet {
        moge::errln!("{}", report::report(&summary, cfg.jobs, false));
        moge::errln!("moge: {} read from the {} model; {} written", args.sparse.display(), format_name(model.format), params.display());
    }
    if let Some(f) = &summary.fatal {
        moge::errln!("moge: stopped: {f}");
        return Ok(EXIT_FATAL);
    }
    if summary.interrupted {
        moge::errln!("moge: interrupted");
        return Ok(EXIT_INTERRUPTED);
    }
    Ok(if summary.failed > 0 { EXIT_SOME_FAILED } else { EXIT_OK })
}

fn format_name(f: moge::colmap::model::Format) -> &'static str {
    match f {
        moge::colmap::model::Format::Text => "text",
        moge::colmap::model::Format::Binary => "binary",
    }
}
