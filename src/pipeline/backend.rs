//! The middle stage's interface. A [`Backend`] says what the decode threads make of a photo,
//! what the middle stage does with it (a forward on the device worker, or a request to a
//! server) and how the encode threads turn the answer into a prediction at the photo's size.
//! The pipeline drives any backend the same way and never asks which one it has.

use std::path::Path;

use anyhow::Result;
use image::RgbImage;

use super::inputs::Input;
use super::plan::Plan;
use crate::image_io::DecodeOptions;
use crate::infer::Prediction;

/// Where the forwards of a run go.
pub trait Backend: Send + Sync {
    /// What a decode thread makes of a photo for the middle stage (the local model's
    /// [`Placed`](super::plan::Placed), a server's upload).
    type Job: Send + 'static;
    /// What the middle stage hands on to the encode threads.
    type Answer: Send + 'static;

    /// Threads of the middle stage: one device worker, or the requests kept in flight.
    fn lanes(&self) -> usize;

    /// Photos that may wait for the middle stage.
    fn queue(&self) -> usize;

    /// On a decode thread: reads the photo and stages it.
    fn stage(&self, input: &Input, plan: &Plan, decode: &DecodeOptions) -> Result<Staged<Self::Job>>;

    /// The middle stage's work on one photo.
    fn forward(&self, job: Self::Job) -> Result<Self::Answer>;

    /// Whether a failure of [`Backend::forward`] would fail every later photo too.
    fn is_fatal(&self, _err: &anyhow::Error) -> bool {
        false
    }

    /// The metric scale in the middle stage's answer (`--video-scale smooth` follows it from
    /// frame to frame before the encode threads finish the frames).
    fn metric_scale(&self, answer: &Self::Answer) -> Option<f32>;

    /// On an encode thread: the prediction at the photo's size, and how it was made.
    fn finish(&self, answer: Self::Answer, photo_size: (usize, usize), plan: &Plan) -> Result<Finished>;

    /// [`Backend::finish`] without using the answer up, with the photo's field of view `fov_x`
    /// (degrees) where given, for `--video-fov smooth`, which solves a frame twice; `None`
    /// where the answer is final (a server's).
    fn finish_again(&self, _answer: &Self::Answer, _photo_size: (usize, usize), _plan: &Plan, _fov_x: Option<f32>) -> Option<Result<Finished>> {
        None
    }

    /// Whether the model has the normal head (so normal maps are written).
    fn has_normal(&self) -> bool;

    /// The model id written in sidecars; `configured` is the run's own name for it.
    fn model_id(&self, configured: &str) -> String;

    /// The SHA-256 of the weights for sidecars, or why it is unavailable.
    fn weights_digest(&self, weights: &Path) -> String;

    /// Whether the forwards run on this machine's CPU cores, which the host stages then share.
    fn shares_cpu(&self) -> bool {
        false
    }

    /// A copy of a staged photo for `--stats`' forward-only comparison; `None` where the
    /// middle stage cannot be timed alone here.
    fn sample(&self, _job: &Self::Job) -> Option<Self::Job> {
        None
    }

    /// Seconds per forward over `samples`, back to back with nothing beside them.
    fn forward_only(&self, _samples: &[Self::Job]) -> Option<(f64, usize)> {
        None
    }
}

/// A photo through the decode stage: what the middle stage takes of it (its [`Backend::Job`])
/// and what the stages after keep.
pub struct Staged<J> {
    pub photo: RgbImage,
    /// What was wrong with the photo that was processed all the same.
    pub warning: Option<String>,
    /// The field of view read from the photo's EXIF and used for it (`--fov-x exif`).
    pub known_fov: Option<crate::image_io::KnownFov>,
    /// Why the photo's EXIF could not be read, where it was asked for.
    pub exif_unreadable: Option<String>,
    /// What the middle stage takes of the photo.
    pub job: J,
    pub decode_ms: f64,
    pub prepare_ms: f64,
}

/// A photo's prediction, and what the sidecar says of how it was made.
pub struct Finished {
    pub pred: Prediction,
    /// Where the network ran (`cpu`, `cuda:0`, `remote <device>`).
    pub device: String,
    pub num_tokens: u32,
    pub grid: (usize, usize),
    /// The server that answered, with its own timings; `None` for a local model.
    pub server: Option<serde_json::Value>,
}
