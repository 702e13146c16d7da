//! `moge quantize`: a checkpoint's product weights stored as int8 (`moge::model::quantize`),
//! about a quarter of the size, for `--precision int8`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

use super::EXIT_OK;
use moge::model::checkpoint::Checkpoint;

#[derive(Args, Debug)]
#[command(after_help = "Run the result with `--weights OUT.safetensors --precision int8`; compare it with f32 on your photos with `moge compare`.")]
pub struct QuantizeArgs {
    /// The checkpoint to quantise.
    #[command(flatten)]
    pub source: super::WeightsArgs,
    /// The int8 checkpoint to write (.safetensors; its config is written beside it as .json).
    #[arg(short, long, value_name = "OUT")]
    pub output: PathBuf,
}

pub fn run(args: QuantizeArgs) -> Result<i32> {
    if args.output.extension().is_none_or(|e| e != "safetensors") {
        bail!("{}: the int8 checkpoint is a .safetensors file; name it so", args.output.display());
    }
    let source = args.source.checkpoint()?;
    let ck = Checkpoint::read(&source)?;
    let (bytes, summary) = moge::model::quantize::int8_safetensors(&ck.tensors).with_context(|| format!("{}: cannot quantise", source.display()))?;
    let config = serde_json::to_string_pretty(&ck.config)?;
    let json = args.output.with_extension("json");
    moge::outputs::write_atomic(&json, |f| Ok(std::io::Write::write_all(f, config.as_bytes())?))?;
    if let Err(e) = moge::outputs::write_atomic(&args.output, |f| Ok(std::io::Write::write_all(f, &bytes)?)) {
        // The config alone would only mislead.
        let _ = std::fs::remove_file(&json);
        return Err(e);
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    moge::outln!(
        "{}: {} weights in int8, {} tensors in f32: {:.1} MiB, {:.0} % of {:.1} MiB in f32 (config: {})",
        args.output.display(),
        summary.int8_tensors,
        summary.f32_tensors,
        mib(summary.bytes),
        100.0 * summary.bytes as f64 / summary.f32_bytes.max(1) as f64,
        mib(summary.f32_bytes),
        json.display()
    );
    Ok(EXIT_OK)
}
