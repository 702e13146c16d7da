//! What the threads of one run share: the stop, the photos kept for `--stats`, the state of
//! its videos and the notices waiting for the collector.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::video::depth::DepthVideos;
use super::video::scale::ScaleSmoother;
use crate::console::Notice;

/// What the threads of one run share.
pub(super) struct Shared<S> {
    /// A fatal error (disk full) halts like a stop request, but is not an interruption.
    pub(super) halt: AtomicBool,
    pub(super) stop: Arc<AtomicBool>,
    /// Staged photos kept for `--stats`' forward-only comparison.
    pub(super) samples: Option<Mutex<Vec<S>>>,
    /// Inputs beyond the list's: the frames of its videos, past each video's first.
    pub(super) more: AtomicUsize,
    /// `--video-scale smooth` (or, for `--video-fov smooth` alone, the frames' order only).
    pub(super) smoother: Option<ScaleSmoother>,
    /// `--video-fov smooth`: the running estimate of tan(fov/2), resolved in the encode stage.
    pub(super) fov_smoother: Option<ScaleSmoother>,
    /// `--format mp4`, and the depth videos that could not be written.
    pub(super) depth_videos: Option<DepthVideos>,
    pub(super) video_errors: AtomicUsize,
    /// Notices from the stages' threads, waiting for the collector to hand them on.
    pub(super) notices: Mutex<Vec<Notice>>,
    /// The note on a camera run in a larger view than its photo is said once.
    pub(super) matrix_noted: AtomicBool,
}

impl<S> Shared<S> {
    pub(super) fn halted(&self) -> bool {
        self.halt.load(Ordering::Relaxed) || self.stop.load(Ordering::Relaxed)
    }

    /// A notice for the collector to hand on.
    pub(super) fn notice(&self, notice: Notice) {
        self.notices.lock().unwrap_or_else(|e| e.into_inner()).push(notice);
    }
}
