//! A run's own work on each prediction, in the encode threads, before the outputs are written
//! (`moge colmap`: the fit to a reconstruction and the depth files it writes).

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::inputs::Input;
use crate::infer::Prediction;

/// What [`Post::apply`] did: the files it wrote, and what the sidecar says of it.
#[derive(Debug, Default)]
pub struct PostDone {
    pub files: Vec<PathBuf>,
    /// A key of the sidecar and its value.
    pub sidecar: Option<(&'static str, serde_json::Value)>,
}

pub trait Post: Send + Sync {
    /// Works on `pred` (which the outputs are then written from) of `input`, whose outputs go
    /// to `stem` and its suffixes. An error fails the input; what it wrote is its own to undo.
    fn apply(&self, input: &Input, pred: &mut Prediction, stem: &Path) -> Result<PostDone>;
}

impl std::fmt::Debug for dyn Post {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Post")
    }
}
