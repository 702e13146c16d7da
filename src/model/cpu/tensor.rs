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

/// `len` zeros, written on every thread of the pool (`vec![0.0; len]` zeroes a reused block on
/// the calling thread alone: tens of MB per decoder convolution at full resolution).
pub fn par_zeros(len: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let mut v: Vec<f32> = Vec::with_capacity(len);
    v.spare_capacity_mut()[..len].par_chunks_mut(1 << 16).for_each(|c| {
        c.iter_mut().for_each(|x| {
            x.write(0.0);
        })
    });
    // SAFETY: all len floats of the capacity were written above.
    unsafe { v.set_len(len) };
    v
}

/// A (rows, cols) f32 matrix transposed into a new contiguous (cols, rows) one, in 32 × 32
/// blocks on the rayon pool: the encoder's taps, tokens × channels, into the decoder's planes.
/// candle's strided copy does it on one thread, down the columns (58 ms per ViT-L tap of 1800
/// × 1024 on an Intel Xeon, 4 % of a bf16 forward).
pub struct Transpose;

impl candle_core::CustomOp1 for Transpose {
    fn name(&self) -> &'static str {
        "transpose2d"
    }
    fn cpu_fwd(&self, s: &candle_core::CpuStorage, l: &candle_core::Layout) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        use rayon::prelude::*;
        let (rows, cols) = l.shape().dims2()?;
        let x = contiguous(s, l, "transpose")?;
        const B: usize = 32;
        let mut out = par_zeros(rows * cols);
        // Each task: B output rows (input columns c0..c0 + B), walked B input rows at a time so
        // that both sides stay within a few KiB.
        out.par_chunks_mut((B * rows).max(1)).enumerate().for_each(|(t, dst)| {
            let c0 = t * B;
            let nc = dst.len() / rows.max(1);
            for r0 in (0..rows).step_by(B) {
                let nr = B.min(rows - r0);
                for r in r0..r0 + nr {
                    let src = &x[r * cols + c0..][..nc];
                    for (c, &v) in src.iter().enumerate() {
                        dst[c * rows + r] = v;
                    }
                }
            }
        });
        Ok((candle_core::CpuStorage::F32(out), candle_core::Shape::from((cols, rows))))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    /// The same values as candle's transpose, at sizes that are not multiples of the block
    /// (and one row, one column).
    #[test]
    fn transpose_matches_candle() {
        for (r, c) in [(1usize, 1usize), (1, 70), (70, 1), (33, 65), (100, 31)] {
            let x = Tensor::from_vec((0..r * c).map(|i| i as f32 * 0.5 - 7.0).collect::<Vec<f32>>(), (r, c), &Device::Cpu).unwrap();
            let got = x.apply_op1_no_bwd(&super::Transpose).unwrap();
            assert_eq!(got.dims(), &[c, r]);
            let want: Vec<Vec<f32>> = x.t().unwrap().contiguous().unwrap().to_vec2().unwrap();
            assert_eq!(got.to_vec2::<f32>().unwrap(), want, "{r}x{c}");
        }
    }
}
