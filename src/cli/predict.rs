//! `moge predict IMAGE... -o DIR`.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::{InferArgs, InputArgs, ModelArgs, OutputArgs, EXIT_OK, EXIT_SOME_FAILED};
use crate::pipeline::inputs;
use crate::pipeline::run::{self, Status};

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
}

pub fn run(args: PredictArgs) -> Result<i32> {
    let (weights, model) = args.model.load()?;
    let cfg = super::pipeline_config(&args.output, &args.model, weights, &args.infer, &args.out, &args.input);
    let mut failed = 0usize;
    // Each path is tried on its own, so that a missing or bad file gets its own error line.
    let mut list: Vec<inputs::Input> = args.images.iter().map(|p| inputs::file_input(p)).collect();
    inputs::mark_collisions(&mut list);
    for input in list {
        let rec = run::process_one(&model, &cfg, &input);
        match rec.status {
            Status::Ok => {
                if let Some(w) = &rec.warning {
                    crate::errln!("moge: warning: {w}");
                }
                let outs: Vec<String> = rec.outputs.iter().map(|p| p.display().to_string()).collect();
                crate::outln!("{}: {} -> {}", input.path.display(), rec.summary.unwrap_or_default(), outs.join(", "));
            }
            _ => {
                failed += 1;
                crate::errln!("moge: {}", rec.error.unwrap_or_default());
            }
        }
    }
    Ok(if failed == 0 { EXIT_OK } else { EXIT_SOME_FAILED })
}
