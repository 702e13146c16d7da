//! Hand-written CPU kernels for the layers where candle's generic CPU ops are slow (spec §9 and
//! runtime.md §2.5: the convolutional decoder at high resolution with few channels). Each is a
//! candle `CustomOp`, so models stay device-generic: other devices take candle's own ops.

pub mod attention;
pub mod bf16;
pub mod conv3x3;
pub mod linear;
pub mod math;
pub mod planes;

/// The kernels are on unless `MOGE_GENERIC_OPS=1` asks for candle's generic ops (to measure
/// what each kernel gains, side by side in one run).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MOGE_GENERIC_OPS").map_or(true, |v| v != "1"))
}

/// Runs `f` on the f32 data of a contiguous CPU tensor, without copying it: the kernels share
/// the model's weight tensors instead of keeping copies of their own.
pub fn with_f32<R>(t: &candle_core::Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => match layout.contiguous_offsets() {
            Some((a, b)) => Ok(f(&v[a..b])),
            None => candle_core::bail!("kernel weight is not contiguous"),
        },
        _ => candle_core::bail!("kernel weight is not an f32 CPU tensor"),
    }
}

/// A raw output pointer shared by parallel tasks that write disjoint parts of one buffer.
pub(crate) struct SendPtr(pub(crate) *mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    /// A method (not field access) so closures capture the whole `Sync` wrapper.
    pub(crate) fn get(&self) -> *mut f32 {
        self.0
    }
}

/// The contiguous f32 data of a kernel input.
pub(crate) fn contiguous<'a>(s: &'a candle_core::CpuStorage, l: &candle_core::Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    let candle_core::CpuStorage::F32(v) = s else { candle_core::bail!("{what}: only f32 is supported") };
    let Some((a, b)) = l.contiguous_offsets() else { candle_core::bail!("{what}: input must be contiguous") };
    Ok(&v[a..b])
}
