//! `moge predict IMAGE... -o DIR`.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Result;
use clap::Args;

use super::report::Reporter;
use super::{InferArgs, InputArgs, ModelArgs, OutputArgs, RemoteArgs, EXIT_FATAL, EXIT_OK, EXIT_SOME_FAILED};
use moge::pipeline::inputs;
use moge::pipeline::record::Status;
use moge::pipeline::run;

#[derive(Args, Debug)]
pub struct PredictArgs {
    /// Image files (jpg, png, webp, bmp, tiff).
    #[arg(required = true, value_name = "IMAGE")]
    pub images: Vec<PathBuf>,
    /// Output directory: IMAGE's stem + .npz (and the other formats' suffixes) goes here.
    #[arg(short, long, value_name = "DIR", default_value = "output")]
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
}

pub fn run(args: PredictArgs) -> Result<i32> {
    let (weights, engine) = args.remote.engine(&args.model, &args.infer)?;
    let cfg = moge::pipeline::run::Config {
        in_flight: args.remote.in_flight as usize,
        ..super::pipeline_config(&args.output, &args.model, weights, &args.infer, args.out.options(), &args.input)
    };
    // Each path is tried on its own, so that a missing or bad file gets its own error line.
    let mut list: Vec<inputs::Input> = args.images.iter().map(|p| inputs::file_input(p)).collect();
    inputs::mark_collisions(&mut list);
    args.infer.attach_cameras(&mut list)?;
    // The pipeline with one thread per host stage prints errors and warnings; the results
    // are one line each on stdout.
    let total = list.len();
    let mut reporter = Reporter::new(false, total, false, |rec: &moge::Record| {
        if rec.status == Status::Ok {
            let outs: Vec<String> = rec.outputs.iter().map(|p| p.display().to_string()).collect();
            moge::outln!("{}: {} -> {}", rec.input.display(), rec.summary.clone().unwrap_or_default(), outs.join(", "));
        }
    });
    let summary = run::run_observed(engine, list, &cfg, &Arc::new(AtomicBool::new(false)), &mut reporter);
    if let Some(f) = &summary.fatal {
        moge::errln!("moge: stopped: {f}");
        return Ok(EXIT_FATAL);
    }
    Ok(if summary.failed == 0 { EXIT_OK } else { EXIT_SOME_FAILED })
}
