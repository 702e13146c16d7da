//! `moge predict IMAGE... -o DIR`.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};

use super::{InferArgs, ModelArgs, EXIT_OK, EXIT_SOME_FAILED};
use crate::Device;

#[derive(Args, Debug)]
pub struct PredictArgs {
    /// Image files (jpg, png, webp, bmp, tiff).
    #[arg(required = true, value_name = "IMAGE")]
    pub images: Vec<PathBuf>,
    /// Output directory: IMAGE's stem + .npz goes here.
    #[arg(short, long, value_name = "DIR", default_value = "output")]
    pub output: PathBuf,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub infer: InferArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Npz)]
    pub format: Format,
    /// Keep the raw pixel order of JPEG/TIFF files (do not apply the EXIF orientation).
    #[arg(long)]
    pub no_exif: bool,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Npz,
}

pub fn run(args: PredictArgs) -> Result<i32> {
    let model = args.model.load(&Device::Cpu)?;
    let opts = args.infer.options();
    let mut failed = 0usize;
    for path in &args.images {
        let result = (|| -> Result<String> {
            let image = crate::image_io::load_rgb(path, !args.no_exif)?;
            let pred = model.infer(&image, &opts)?;
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "image".into());
            let out = args.output.join(format!("{stem}.npz"));
            crate::outputs::npz::write(&out, &pred, true)?;
            Ok(format!("{}: {} -> {}", path.display(), pred.summary(), out.display()))
        })();
        match result {
            Ok(line) => println!("{line}"),
            Err(e) => {
                failed += 1;
                eprintln!("moge: {e:#}");
            }
        }
    }
    Ok(if failed == 0 { EXIT_OK } else { EXIT_SOME_FAILED })
}
