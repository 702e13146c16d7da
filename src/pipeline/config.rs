//! Everything fixed for one run of the pipeline.

use std::path::PathBuf;

use super::inputs::Input;
use super::plan::Plan;
use crate::fit::FitMode;
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
    /// How each photo meets the network; its `fov` is where each photo's field of view is
    /// read from (the decoders are told it: `decode.fov` is not read).
    pub plan: Plan,
    /// How photos are read.
    pub decode: crate::image_io::DecodeOptions,
    /// Read videos frame by frame (`moge batch`); elsewhere a video is a failed input saying
    /// so (one prediction per path has no place for a video's many).
    pub videos: bool,
    /// Which frames of each video are taken.
    pub frames: Sampling,
    /// `--video-scale smooth`: the time constant (seconds) of the running estimate of each
    /// video's metric scale; `None` keeps each frame's own.
    pub video_scale: Option<f64>,
    /// `--video-fov smooth`: the time constant (seconds) of the running estimate of each video's
    /// field of view (of log tan(fov/2): log focal); `None` keeps each frame's own. A model run
    /// here only: each frame is solved twice, for its own and with the estimate.
    pub video_fov: Option<f64>,
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
    /// Work of the run's own on each prediction before its outputs are written.
    pub post: Option<std::sync::Arc<dyn super::post::Post>>,
}

impl Config {
    /// The command line's defaults (npz outputs, one host thread per core up to 8 per host
    /// stage, the photo's own size, no reports) with [`Plan::default`]'s options, writing under
    /// `output`.
    pub fn new(output: impl Into<PathBuf>) -> Self {
        Self {
            output: output.into(),
            outputs: OutputOptions::default(),
            plan: Plan::default(),
            decode: crate::image_io::DecodeOptions::default(),
            videos: false,
            frames: Sampling::default(),
            video_scale: None,
            video_fov: None,
            jobs: default_jobs(),
            skip_existing: false,
            stats: false,
            model_id: String::new(),
            weights: PathBuf::new(),
            in_flight: 4,
            keep_predictions: false,
            post: None,
        }
    }

    /// How each photo meets the network: the maps that no output needs are not made.
    /// A run that keeps its predictions makes every map it was asked for.
    pub(super) fn effective_plan(&self) -> Plan {
        let keep = self.keep_predictions;
        let infer = InferOptions {
            point_map: self.plan.infer.point_map && (keep || self.outputs.needs_points()),
            normal_map: self.plan.infer.normal_map && (keep || self.outputs.needs_normal_floats()),
            ..self.plan.infer.clone()
        };
        Plan { infer, ..self.plan.clone() }
    }

    /// How photos are read, the field of view's source being the plan's.
    pub(super) fn decode_options(&self) -> crate::image_io::DecodeOptions {
        crate::image_io::DecodeOptions { fov: self.plan.fov, ..self.decode.clone() }
    }

    /// What a sidecar says of how a photo met the network: where it ran (`device`, the
    /// token count and grid, the `server` that answered), this run's fit and canvas, and where
    /// the photo's field of view came from (`known`: its EXIF or camera matrix).
    pub(super) fn inference_info(
        &self,
        known: Option<&KnownFov>,
        exif_unreadable: Option<&str>,
        device: String,
        num_tokens: u32,
        grid: (usize, usize),
        server: Option<serde_json::Value>,
    ) -> InferenceInfo {
        InferenceInfo {
            device,
            num_tokens,
            grid,
            fit: self.plan.fit.name().into(),
            canvas: (self.plan.fit != FitMode::Exact).then_some((self.plan.canvas.width, self.plan.canvas.height)),
            exif_orientation: self.decode.apply_exif,
            fov_x_given: known.map(|f| f.degrees).or(self.plan.infer.fov_x),
            fov_x_source: match (known, self.plan.infer.fov_x, self.plan.fov) {
                (Some(f), _, FovFrom::Exif) => format!("exif: {}", f.from),
                (Some(f), _, _) => f.from.clone(),
                (None, Some(_), _) => "given".into(),
                (None, None, FovFrom::Exif) => match exif_unreadable {
                    Some(why) => format!("estimated: EXIF unreadable: {why}"),
                    None => "estimated: no EXIF focal length".into(),
                },
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
