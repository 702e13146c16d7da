//! Hand-written CPU kernels for the layers where candle's generic CPU ops are slow (spec §9 and
//! runtime.md §2.5: the convolutional decoder at high resolution with few channels). Each is a
//! candle `CustomOp`, so models stay device-generic: other devices take candle's own ops.

pub mod attention;
pub mod bf16;
pub mod conv3x3;
pub mod linear;
pub mod planes;

/// The kernels are on unless `MOGE_GENERIC_OPS=1` asks for candle's generic ops (to measure
/// what each kernel gains, side by side in one run).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MOGE_GENERIC_OPS").map_or(true, |v| v != "1"))
}
