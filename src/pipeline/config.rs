//! Everything fixed for one run of the pipeline.

use std::path::PathBuf;

use super::inputs::Input;
use super::stages::Plan;
use crate::fit::{Canvas, FitMode};
use crate::image_io::video::Sampling;
use crate::image_io::{FovFrom, KnownFov};
use crate::infer::InferOptions;
use crate::outputs::json::InferenceInfo;
use crate::outputs::OutputOptions;

/// Everything fixed for one run.
#[derive(Debug, Clone)]
pub struct Config {
    pub output: PathBuf,
    pub outputs: OutputOptions,
    pub infer: InferOptions,
    pub fit: FitMode,
    pub canvas: Canvas,
    pub decode: crate::image_io::DecodeOptions,
    /// Read videos frame by frame (`moge batch`); elsewhere a video is a failed input saying
    /// so (one prediction per path has no place for a video's many).
    pub videos: bool,
    /// Which frames of each video are taken.
    pub frames: Sampling,
    /// `--video-scale smooth`: the time constant (seconds) of the running estimate of each
    /// video's metric scale; `None` keeps each frame's own.
    pub video_scale: Option<f64>,
    /// Host threads per host stage (decode, encode).
    pub jobs: usize,
    pub skip_existing: bool,
    /// Time the forward alone on a few of the run's photos after it
    /// ([`Summary::forward_only`](super::report::Summary::forward_only), for `--stats`' report).
    pub stats: bool,
    /// Model id for the sidecar, and the weights file to digest.
    pub model_id: String,
    pub weights: PathBuf,
    /// Requests in flight at once with a remote engine.
    pub in_flight: usize,
    /// Hand each prediction to the caller in its [`Record`](super::record::Record) (the library's in-memory runs).
    /// The records then wait in a bounded queue, so that a slow caller holds the pipeline
    /// back rather than letting predictions pile up.
    pub keep_predictions: bool,
}

impl Config {
    /// The command line's defaults (npz outputs, one host thread per core up to 8 per host
    /// stage, the photo's own size, no reports) with [`Plan::default`]'s options, writing under
    /// `output`.
    pub fn new(output: impl Into<PathBuf>) -> Self {
        let Plan { infer, fit, canvas, fov: _ } = Plan::default();
        Self {
            output: output.into(),
            outputs: OutputOptions::default(),
            infer,
            fit,
            canvas,
            decode: crate::image_io::DecodeOptions::default(),
            videos: false,
            frames: Sampling::default(),
            video_scale: None,
            jobs: default_jobs(),
            skip_existing: false,
            stats: false,
            model_id: String::new(),
            weights: PathBuf::new(),
            in_flight: 4,
            keep_predictions: false,
        }
    }

    /// How each photo meets the network: the maps that no output needs are not made.
    /// A run that keeps its predictions makes every map it was asked for.
    pub(super) fn plan(&self) -> Plan {
        let keep = self.keep_predictions;
        let infer = InferOptions {
            point_map: self.infer.point_map && (keep || self.outputs.needs_points()),
            normal_map: self.infer.normal_map && (keep || self.outputs.needs_normal_floats()),
            ..self.infer.clone()
        };
        Plan { infer, fit: self.fit, canvas: self.canvas, fov: self.decode.fov }
    }

    /// What a sidecar says of how a photo met the network: where it ran (`device`, the
    /// token count and grid, the `server` that answered), this run's fit and canvas, and where
    /// the photo's field of view came from (`known`: its EXIF or camera matrix).
    pub(super) fn inference_info(
        &self,
        known: Option<&KnownFov>,
        device: String,
        num_tokens: u32,
        grid: (usize, usize),
        server: Option<serde_json::Value>,
    ) -> InferenceInfo {
        InferenceInfo {
            device,
            num_tokens,
            grid,
            fit: self.fit.name().into(),
            canvas: (self.fit != FitMode::Exact).then_some((self.canvas.width, self.canvas.height)),
            exif_orientation: self.decode.apply_exif,
            fov_x_given: known.map(|f| f.degrees).or(self.infer.fov_x),
            fov_x_source: match (known, self.infer.fov_x, self.decode.fov) {
                (Some(f), _, FovFrom::Exif) => format!("exif: {}", f.from),
                (Some(f), _, _) => f.from.clone(),
                (None, Some(_), _) => "given".into(),
                (None, None, FovFrom::Exif) => "estimated: no EXIF focal length".into(),
                (None, None, _) => "estimated".into(),
            },
            server,
        }
    }

    /// The output stem of an input.
    pub fn stem(&self, input: &Input) -> PathBuf {
        self.output.join(&input.rel)
    }
}

/// Host threads per host stage unless told: one per core, up to 8.
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8)
}
