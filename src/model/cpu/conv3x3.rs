//! 3x3 convolution with replicate padding (`padding=1, padding_mode='replicate'`), optionally
//! with a ReLU on its input, as tiled im2col + GEMM: each tile of output rows unfolds only the
//! input rows it needs into a buffer that stays in cache, then one GEMM per tile writes all
//! output channels. Tiles run in parallel, each GEMM single-threaded.

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape};
use std::sync::Arc;

use rayon::prelude::*;

use super::SendPtr;

use super::bf16::{gemm_bf16_packed_a, PackedA};

pub struct Conv3x3Op {
    /// (cout, cin, 3, 3) contiguous: row-major (cout, cin·9), column ci·9 + ky·3 + kx.
    pub weight: candle_core::Tensor,
    pub bias: Vec<f32>,
    pub cin: usize,
    pub cout: usize,
    /// Apply ReLU to the input as it is unfolded (ResidualConvBlock's pre-activation).
    pub relu_input: bool,
    /// The weight pre-packed for bf16 products, when the model runs in bf16.
    pub packed: Option<Arc<PackedA>>,
}

/// Target size of one tile's unfolded input, in floats (~1 MiB: L2-resident).
const TILE_FLOATS: usize = 256 * 1024;

impl Conv3x3Op {
    fn run(&self, x: &[f32], weight: &[f32], h: usize, w: usize) -> Vec<f32> {
        let (cin, cout) = (self.cin, self.cout);
        let k = cin * 9;
        let hw = h * w;
        let mut out = vec![0f32; cout * hw];
        let rows_per_tile = (TILE_FLOATS / (k * w).max(1)).clamp(1, h);
        let tiles: Vec<(usize, usize)> = (0..h).step_by(rows_per_tile).map(|y0| (y0, (y0 + rows_per_tile).min(h))).collect();
        let out_ptr = SendPtr(out.as_mut_ptr());
        let relu = self.relu_input;
        tiles.par_iter().for_each_init(Vec::new, |cols: &mut Vec<f32>, &(y0, y1)| {
            let n = (y1 - y0) * w;
            cols.resize(k * n, 0.0);
            for ci in 0..cin {
                let plane = &x[ci * hw..(ci + 1) * hw];
                for ky in 0..3 {
                    for kx in 0..3 {
                        let dst = &mut cols[(ci * 9 + ky * 3 + kx) * n..(ci * 9 + ky * 3 + kx + 1) * n];
                        for (ty, y) in (y0..y1).enumerate() {
                            let sy = (y + ky).saturating_sub(1).min(h - 1);
                            let src = &plane[sy * w..(sy + 1) * w];
                            let d = &mut dst[ty * w..(ty + 1) * w];
                            // Column shift by kx-1 with the edge pixel replicated.
                            match kx {
                                0 => {
                                    d[0] = src[0];
                                    d[1..].copy_from_slice(&src[..w - 1]);
                                }
                                1 => d.copy_from_slice(src),
                                _ => {
                                    d[..w - 1].copy_from_slice(&src[1..]);
                                    d[w - 1] = src[w - 1];
                                }
                            }
                            if relu {
                                d.iter_mut().for_each(|v| *v = v.max(0.0));
                            }
                        }
                    }
                }
            }
            // out[:, y0·w .. y1·w] = bias + W · cols
            // Tiles write disjoint column ranges of `out`.
            let dst = unsafe { out_ptr.get().add(y0 * w) };
            if let Some(packed) = &self.packed {
                // bf16 products into a tile-local buffer, then copied to this tile's columns.
                let mut tile = vec![0f32; cout * n];
                for (o, r) in tile.chunks_exact_mut(n).enumerate() {
                    r.fill(self.bias[o]);
                }
                gemm_bf16_packed_a(packed, cols, n, n, &mut tile, n, true, 1);
                for (o, r) in tile.chunks_exact(n).enumerate() {
                    unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), dst.add(o * hw), n) };
                }
                return;
            }
            unsafe {
                for o in 0..cout {
                    std::slice::from_raw_parts_mut(dst.add(o * hw), n).fill(self.bias[o]);
                }
                gemm::gemm(
                    cout,
                    n,
                    k,
                    dst,
                    1,
                    hw as isize,
                    true,
                    weight.as_ptr(),
                    1,
                    k as isize,
                    cols.as_ptr(),
                    1,
                    n as isize,
                    1.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        });
        out
    }
}

impl CustomOp1 for Conv3x3Op {
    fn name(&self) -> &'static str {
        "conv3x3-replicate"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (c, h, w) = layout.shape().dims3()?;
        if c != self.cin {
            candle_core::bail!("conv3x3: input has {c} channels, weight expects {}", self.cin);
        }
        let data = match storage {
            CpuStorage::F32(v) => v,
            _ => candle_core::bail!("conv3x3: only f32 is supported"),
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("conv3x3: input must be contiguous")
        };
        let out = super::with_f32(&self.weight, |wt| self.run(&data[start..end], wt, h, w))?;
        Ok((CpuStorage::F32(out), Shape::from((self.cout, h, w))))
    }
}
