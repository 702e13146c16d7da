//! The MoGe-2 network (`moge/model/v2.py`) over candle, device-generic: the same code runs on
//! any candle device. Host work (input resize, position-embedding resize, output resize and
//! post-processing) is split out so a pipeline can run it on other threads.

pub mod checkpoint;
pub mod config;
pub mod cpu;
pub mod dinov2;
pub mod modules;
pub mod pickle;
pub mod v2;
pub mod weights;

pub use v2::{Model, Prepared, RawOutput, Stages};

/// Arithmetic of the network's matrix products. Weights, activations and every other op stay
/// in f32; `Bf16` rounds the two inputs of each large product (linears, convolutions) to bf16 and
/// accumulates in f32, which is where AVX512-BF16 CPUs are 2-4x faster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    #[default]
    F32,
    Bf16,
}

/// Token grid of `forward()`: rows = round(√(n/a)), cols = round(√(n·a)), half to even as
/// Python's `round`.
pub fn token_grid(width: usize, height: usize, num_tokens: u32) -> (usize, usize) {
    let a = width as f64 / height as f64;
    let n = num_tokens as f64;
    let rows = (n / a).sqrt().round_ties_even().max(1.0) as usize;
    let cols = (n * a).sqrt().round_ties_even().max(1.0) as usize;
    (rows, cols)
}
