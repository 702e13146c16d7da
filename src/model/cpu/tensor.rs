//! The f32 data of candle's CPU tensors, read in place by the kernels.

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

/// The contiguous f32 data of a kernel input.
pub(crate) fn contiguous<'a>(s: &'a candle_core::CpuStorage, l: &candle_core::Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    let candle_core::CpuStorage::F32(v) = s else { candle_core::bail!("{what}: only f32 is supported") };
    let Some((a, b)) = l.contiguous_offsets() else { candle_core::bail!("{what}: input must be contiguous") };
    Ok(&v[a..b])
}
