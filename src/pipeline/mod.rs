//! The streaming pipeline (decode threads → the middle stage → encode threads).
//!
//! - [`inputs`]: discovery (recursive, sorted, hidden skipped), lists, `--shard`.
//! - [`plan`]: how a photo meets the network, and each stage's work on it with the local
//!   model, whatever its source and sink.
//! - [`backend`]: the middle stage's interface, implemented by [`local`] (the model here) and
//!   [`remote`] (a MoGe-2 HTTP server) and [`pool`] (several, with failover).
//! - [`worker`]: the middle stage's queue and threads (the device worker), shared by `batch`,
//!   `predict` and `serve`.
//! - [`post`]: a run's own work on each prediction before it is written (`moge colmap`).
//! - [`shared_camera`]: `--camera shared`, one field of view (and scale) per folder or video.
//! - [`guard`]: a panic in one image's work fails that image only; [`host_only`]: the host
//!   stages timed alone (`moge bench --host-only`).
//! - [`video`]: videos' frames as inputs, their smoothed scale and their depth videos.
//! - [`config`]: what is fixed for a run; [`run`]: the stages over files; `shared`: what
//!   its threads share; [`record`] and [`report`]: what a run says of each image
//!   and of itself.

pub mod backend;
pub mod config;
pub mod guard;
pub mod host_only;
pub mod inputs;
pub mod local;
pub mod plan;
pub mod pool;
pub mod post;
pub mod record;
pub mod remote;
pub mod report;
pub mod run;
mod shared;
pub mod shared_camera;
pub mod video;
pub mod worker;
