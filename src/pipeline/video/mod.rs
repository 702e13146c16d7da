//! Videos in a run (`moge batch` on `.mp4`, `.mov`, ...):
//!
//! - [`feed`]: a video's frames as inputs, and the run's shared state for its videos;
//! - [`scale`]: `--video-scale smooth`, a video's metric scale followed from frame to frame;
//! - [`depth`]: `--format mp4`, a video's frames' depth as a video.

pub mod depth;
pub mod feed;
pub mod scale;
