//! Hand-written CPU kernels for the layers where candle's generic CPU ops are slow (the
//! convolutional decoder at high resolution with few channels, the ViT's attention and
//! epilogues). Each is a candle `CustomOp`, so models stay device-generic: other devices take
//! candle's own ops. Which instruction set they use is chosen in [`crate::simd::isa`] only;
//! the kernels they share with each other (the f32 products, the elementwise maths) are in
//! [`crate::simd`].
//!
//! One axis: per operation ([`linear`], [`layer_norm`], [`attention`], [`conv1x1`], [`conv3x3`]), each with
//! its per-ISA files beside its portable twin (`conv3x3/avx512.rs` beside `conv3x3/mod.rs`);
//! the products several operations share ([`matmul`]: the one-tap f32 product, bf16, int8) cut
//! the same way. A new ISA level is new files beside the old and an arm in the `route`
//! function of each family it serves; [`route()`] reports what those functions chose.

pub mod attention;
pub mod conv1x1;
pub mod conv3x3;
pub mod layer_norm;
pub mod linear;
pub mod matmul;
pub mod route;
pub mod sparse_conv;
pub mod tensor;

// What the model and the command line ask of the kernels, at the top.
pub use route::{enabled, route, route_description, Kernels, Route};
pub use tensor::with_f32;
