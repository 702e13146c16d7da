//! The streaming pipeline (decode threads → one device worker → encode threads).
//!
//! - [`inputs`]: discovery (recursive, sorted, hidden skipped), lists, `--shard`.
//! - [`fit`]: `--fit pad|stretch` onto a fixed canvas and back.
//! - [`stages`]: each stage's work on one photo, whatever its source and sink.
//! - [`worker`]: the device worker, shared by `batch`, `predict` and `serve`.
//! - [`guard`]: a panic in one image's work fails that image only.
//! - [`run`]: the stages over files, reporting, per-stage statistics.

pub mod fit;
pub mod guard;
pub mod inputs;
pub mod run;
pub mod stages;
pub mod worker;
