//! The streaming pipeline (decode threads → the middle stage → encode threads).
//!
//! - [`inputs`]: discovery (recursive, sorted, hidden skipped), lists, `--shard`.
//! - [`stages`]: each stage's work on one photo with the local model, whatever its source and sink.
//! - [`backend`]: the middle stage's interface, implemented by [`local`] (the model here) and
//!   [`remote`] (a MoGe-2 HTTP server) and [`pool`] (several, with failover).
//! - [`worker`]: the middle stage's queue and threads (the device worker), shared by `batch`,
//!   `predict` and `serve`.
//! - [`guard`]: a panic in one image's work fails that image only.
//! - [`depth_video`]: `--format mp4`, a video's frames' depth as a video.
//! - [`run`]: the stages over files; [`record`] and [`report`]: what a run says of each image
//!   and of itself; [`scale`]: a video's metric scale followed from frame to frame.

pub mod backend;
pub mod depth_video;
pub mod guard;
pub mod inputs;
pub mod local;
pub mod pool;
pub mod record;
pub mod remote;
pub mod report;
pub mod run;
pub mod scale;
pub mod stages;
pub mod worker;
