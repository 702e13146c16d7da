//! The streaming batch pipeline (decode threads → one device worker → encode threads).
//!
//! - [`inputs`]: discovery (recursive, sorted, hidden skipped), lists, `--shard`.
//! - [`fit`]: `--fit pad|stretch` onto a fixed canvas and back.
//! - [`run`]: the three stages, reporting, per-stage statistics.

pub mod fit;
pub mod inputs;
pub mod run;
