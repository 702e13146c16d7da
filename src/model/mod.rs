//! The MoGe-2 network (`moge/model/v2.py`) over candle, device-generic: the same code runs on
//! any candle device. Host work (input resize, position-embedding resize, output resize and
//! post-processing) is split out so a pipeline can run it on other threads.

pub mod build;
pub mod checkpoint;
pub mod config;
pub mod cpu;
pub mod dinov2;
#[cfg(feature = "cuda")]
mod graph;
pub mod modules;
pub mod pickle;
pub mod quantize;
pub mod runner;
pub mod sparse_unet;
pub mod v2;
pub mod v3;
pub mod voxels;
pub mod weights;

pub use build::{BuildOptions, Ops};
pub use runner::Runner;
pub use v2::{Intermediates, Model, Prepared, RawOutput, GRIDS_CACHED};

/// Arithmetic of the network's matrix products. Weights, activations and every other op stay
/// in f32; `Bf16` rounds the two inputs of each large product (linears, convolutions) to bf16 and
/// accumulates in f32, which is where AMD's AVX512-BF16 CPUs are 2-4x faster (Intel's are
/// slower than in f32: `cpu::matmul::bf16::pays`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    #[default]
    F32,
    Bf16,
    /// The transformer blocks' linears (qkv, proj, fc1, fc2) and the decoder's convolutions of
    /// 32 channels and more (1x1: 64; `cpu::matmul::int8`) as int8 products on the CPU: weights per
    /// output channel, activations per token or pixel, int32 sums. Attention, the output
    /// convolutions, the scale head and everything else stay f32. Never `auto`: it is asked for.
    Int8,
}

crate::names::names!(Precision, "precision", { F32 => "f32", Bf16 => "bf16", Int8 => "int8" });

impl Precision {
    /// What `--precision auto` takes on `device`: bf16 products (f32 accumulation, f32 between
    /// products) on a GPU and on a CPU whose route computes bf16 products natively (not under
    /// `MOGE_MAX_CPU_ISA` below avx512bf16) and faster than f32 (`cpu::matmul::bf16::pays`), else f32.
    pub fn auto(device: &candle_core::Device) -> Precision {
        if !device.is_cpu() || cpu::matmul::bf16::pays() {
            Precision::Bf16
        } else {
            Precision::F32
        }
    }
}

/// The generic path's matrix product of f32 activations (either side may be a weight already
/// in `dtype`), with an f32 result. In bf16 both inputs are rounded to bf16 and the product is
/// accumulated in f32 and rounded to bf16 once (cuBLAS's bf16 product, as under PyTorch's
/// autocast); everything between products stays f32. candle's CPU has no bf16 product: there the
/// same arithmetic runs in f32 on the rounded inputs, so the tests can check the GPU's numbers.
pub fn matmul(a: &candle_core::Tensor, b: &candle_core::Tensor, dtype: candle_core::DType) -> candle_core::Result<candle_core::Tensor> {
    use candle_core::DType;
    match dtype {
        DType::F32 => a.matmul(b),
        _ if a.device().is_cpu() => {
            let round = |t: &candle_core::Tensor| t.to_dtype(dtype)?.to_dtype(DType::F32);
            round(&round(a)?.matmul(&round(b)?)?)
        }
        _ => a.to_dtype(dtype)?.matmul(&b.to_dtype(dtype)?)?.to_dtype(DType::F32),
    }
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
