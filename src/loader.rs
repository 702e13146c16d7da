//! Loading a model as the command line does: a published name (from the hub cache, downloaded
//! when missing) or a checkpoint file, on a device, at a precision.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};

use crate::device::DeviceRequest;
use crate::model::build::BuildOptions;
use crate::model::v2::Model;
use crate::model::Precision;

/// How [`load`] loads a model; the default is the command line's (`--revision main`, `--device
/// auto`, `--precision auto`).
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The hub revision of a published model (a branch, tag or commit).
    pub revision: String,
    /// `None`: bf16 products where this device runs them faster than f32 ([`Precision::auto`]).
    pub precision: Option<Precision>,
    pub device: DeviceRequest,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { revision: crate::hub::DEFAULT_REVISION.to_owned(), precision: None, device: DeviceRequest::default() }
    }
}

/// Loads `model`: a published name ([`crate::hub::MODELS`], e.g. `vitl-normal`) or the path of a
/// checkpoint (upstream's `model.pt`, or `.safetensors` with its JSON config beside it). The
/// device is opened first, so that a missing GPU is said before a download.
///
/// ```
/// let opts = moge::LoadOptions { device: moge::DeviceRequest::Cpu, ..Default::default() };
/// let model = moge::load("tests/fixtures/tiny_normal.pt", &opts)?;
/// let photo = image::RgbImage::from_fn(64, 48, |x, y| image::Rgb([(4 * x) as u8, (5 * y) as u8, 128]));
/// let prediction = model.infer(&photo, &moge::InferOptions::default())?;
/// assert_eq!((prediction.width, prediction.height), (64, 48));
/// assert_eq!(prediction.depth.len(), 64 * 48);
/// # Ok::<(), anyhow::Error>(())
/// ```
pub fn load(model: &str, opts: &LoadOptions) -> Result<Model> {
    let device = crate::device::open(opts.device).map_err(|e| anyhow!("device {}: {e}", opts.device))?;
    let precision = opts.precision.unwrap_or_else(|| Precision::auto(&device.device));
    let build = BuildOptions::new(&device.device, precision).map_err(|e| anyhow!("device {}: {e}", opts.device))?;
    let path = checkpoint(model, &opts.revision)?;
    Model::load(&path, &build)
}

/// The checkpoint file of `model`: a published name's, from the hub cache or downloaded, or the
/// path itself.
pub fn checkpoint(model: &str, revision: &str) -> Result<PathBuf> {
    if crate::hub::MODELS.iter().any(|(name, _)| *name == model) {
        return crate::hub::resolve_revision(model, revision);
    }
    let path = Path::new(model);
    if !path.exists() {
        let names: Vec<_> = crate::hub::MODELS.iter().map(|(n, _)| *n).collect();
        // A NotFound error underneath, so that a program (the Python binding) can tell a
        // missing file from a bad one.
        let why = format!("{model}: no such checkpoint file, and not a published model ({})", names.join(", "));
        return Err(std::io::Error::new(std::io::ErrorKind::NotFound, why).into());
    }
    Ok(path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_that_is_neither_published_nor_a_file_says_what_is_published() {
        let e = checkpoint("vitx-normal", "main").unwrap_err().to_string();
        assert!(e.contains("vitx-normal") && e.contains("no such checkpoint file"), "{e}");
        assert!(crate::hub::MODELS.iter().all(|(name, _)| e.contains(name)), "{e}");
    }

    #[test]
    fn a_path_is_taken_as_it_is() {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny_normal.pt");
        assert_eq!(checkpoint(p, "main").unwrap(), Path::new(p));
    }
}
