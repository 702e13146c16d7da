//! The outcome of each photo, as the collector reports it, and who it is reported to.

use std::path::PathBuf;

use super::inputs::Input;
use super::report::Summary;
use crate::console::{error_line, Notice};
use crate::infer::Prediction;
use crate::outputs;
use crate::outputs::json::Timings;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Failed,
    Skipped,
}

/// The outcome of one image.
#[derive(Debug, Clone)]
pub struct Record {
    pub input: PathBuf,
    /// The frame of the video `input`: its number and time (seconds).
    pub frame: Option<(u64, Option<f64>)>,
    /// The input's place in the run's list.
    pub index: usize,
    pub status: Status,
    pub outputs: Vec<PathBuf>,
    pub timings: Timings,
    pub error: Option<String>,
    /// An error that every later image would hit too (disk full, read-only output).
    pub fatal: bool,
    /// The kind of the I/O error underneath the error, if one is (a missing photo: NotFound).
    pub io_kind: Option<std::io::ErrorKind>,
    /// Valid pixels clamped in the depth PNG.
    pub saturated: usize,
    /// `Prediction::summary()` of a processed image.
    pub summary: Option<String>,
    /// What was wrong with an input that was processed all the same (`--allow-truncated`).
    pub warning: Option<String>,
    /// The prediction itself, when the run keeps them ([`super::config::Config::keep_predictions`]).
    pub prediction: Option<Box<Prediction>>,
}

impl Record {
    /// An input whose outputs are all there already (`--skip-existing`).
    pub fn skipped(input: &Input, outputs: Vec<PathBuf>) -> Self {
        Self::new(input, Status::Skipped, outputs, Timings::default())
    }

    /// An input that failed with `err` after `timings` of work.
    pub fn failed(input: &Input, err: &anyhow::Error, timings: Timings) -> Self {
        let msg = error_line(err);
        let shown = input.name();
        // Errors from reading the photo already start with its path.
        let error = if msg.starts_with(&shown) { msg } else { format!("{shown}: {msg}") };
        let io_kind = err.chain().find_map(|c| c.downcast_ref::<std::io::Error>()).map(std::io::Error::kind);
        Record { error: Some(error), fatal: outputs::is_fatal_io(err), io_kind, ..Self::new(input, Status::Failed, vec![], timings) }
    }

    pub(crate) fn new(input: &Input, status: Status, outputs: Vec<PathBuf>, timings: Timings) -> Self {
        Record {
            input: input.path.clone(),
            frame: input.frame.as_ref().map(|f| (f.index, f.time)),
            index: input.index,
            status,
            outputs,
            timings,
            error: None,
            fatal: false,
            io_kind: None,
            saturated: 0,
            summary: None,
            warning: None,
            prediction: None,
        }
    }
}

/// Who a run reports to as it goes, on the calling thread: each input's record, and the
/// notices between them. The library prints nothing itself; the command line's observer draws
/// the progress bar and writes the error, warning and JSON lines.
pub trait Observer {
    /// One input's outcome; `so_far` counts it already (and `so_far.total` counts a video's
    /// frames as they are read).
    fn record(&mut self, rec: Record, so_far: &Summary);

    /// Something said of the run beside the records (also kept in [`Summary::notices`]).
    fn notice(&mut self, _notice: &Notice) {}

    /// The last record has come; notices may still follow (depth videos that could not be
    /// finished).
    fn records_done(&mut self) {}
}

/// An observer of the records alone: [`super::run::run`]'s callback.
pub struct OnRecord<F>(pub F);

impl<F: FnMut(Record)> Observer for OnRecord<F> {
    fn record(&mut self, rec: Record, _so_far: &Summary) {
        (self.0)(rec)
    }
}
