//! Hand-written CPU kernels for the layers where candle's generic CPU ops are slow (spec §9 and
//! runtime.md §2.5: the convolutional decoder at high resolution with few channels). Each is a
//! candle `CustomOp`, so models stay device-generic: other devices take candle's own ops.

pub mod bf16;
pub mod conv3x3;
