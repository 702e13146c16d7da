//! The integration tests, one binary: a module per area, what they share in `support`.
//! `cargo test --test it fullsize::` runs one area, `cargo test --test it -- --exact
//! fullsize::fullsize_vitl_normal_1800_tokens` one test.

mod support;

mod batch;
mod bench_cli;
mod bf16;
mod camera;
mod checkpoint;
mod cli_assets;
mod colmap;
mod commands;
mod compare;
mod damaged_inputs;
mod degenerate;
mod exif_focal;
mod fullsize;
mod fuzz_replay;
mod generic_ops;
#[cfg(feature = "heif")]
mod heif;
mod host_paths;
mod hub;
mod int8;
mod layers;
mod moge3;
mod numerics;
mod panorama;
mod parity;
mod pool;
mod predict;
mod quantize;
mod remote_client;
mod serve;
mod silent;
mod synth;
mod video;
