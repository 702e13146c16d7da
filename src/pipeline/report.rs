//! What a run says of itself once it is over: its counts, its stages' busy time, what it
//! noticed on the way. The command line draws it (the summary line, `--stats`' report).

use std::time::Duration;

use crate::console::Notice;

/// Busy time per stage, summed over images (seconds).
#[derive(Debug, Clone, Default)]
pub struct StageTotals {
    pub decode: f64,
    pub prepare: f64,
    pub forward: f64,
    pub postprocess: f64,
    pub write: f64,
}

impl StageTotals {
    pub(crate) fn add(&mut self, t: &crate::outputs::json::Timings) {
        self.decode += t.decode / 1e3;
        self.prepare += t.prepare / 1e3;
        self.forward += t.forward / 1e3;
        self.postprocess += t.postprocess / 1e3;
        self.write += t.write.unwrap_or(0.0) / 1e3;
    }
}

#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub total: usize,
    pub done: usize,
    pub failed: usize,
    pub skipped: usize,
    pub interrupted: bool,
    pub fatal: Option<String>,
    pub wall: Duration,
    pub stages: StageTotals,
    /// Back-to-back forwards on sample images after the run: (seconds per image, samples).
    pub forward_only: Option<(f64, usize)>,
    /// Valid pixels clamped in depth PNGs, over the run.
    pub depth_png_saturated: usize,
    /// What the run said beside its records, in order (also handed to its observer).
    pub notices: Vec<Notice>,
}

impl Summary {
    pub fn not_started(&self) -> usize {
        self.total - self.done - self.failed - self.skipped
    }
}
