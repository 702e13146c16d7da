//! The products several operations share, each with its per-ISA files beside its portable
//! twin: the `gemm` crate's f32 product behind one typed call ([`gemm`]), the f32 one-tap product ([`pointwise`], on the kernels of [`crate::simd::sgemm`]), the
//! bf16 product ([`bf16`]) and the int8 one ([`int8`]).

pub mod bf16;
pub mod gemm;
pub mod int8;
pub mod pointwise;
