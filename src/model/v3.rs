//! What MoGe-3 (`moge/model/v3.py`) adds to MoGe-2's network: the refine loop. The points head's
//! raw output (x/z, y/z, log z) at head resolution is voxelised, one voxel per pixel, and the
//! sparse U-Net ([`super::sparse_unet`]) corrects log z; `refine_steps` times, the voxels rebuilt
//! from each step's depth. What follows (resize, exp remap, focal and shift) is MoGe-2's, on the
//! refined map.

use anyhow::{bail, Result};

use super::v2::{Model, RawOutput};
use super::voxels::Voxels;

/// Upstream's default `refine_steps`.
pub const DEFAULT_REFINE_STEPS: usize = 3;

/// The most refine steps a call may ask for (each costs about an encoder's work).
pub const MAX_REFINE_STEPS: usize = 16;

/// `_voxelize`: each pixel's depth bin `round(log z · resolution)` (f32, half to even) less the
/// map's minimum, or why the map cannot be voxelised.
pub fn depth_bins(logz: &[f32], resolution: f64) -> Result<Vec<u32>> {
    let res = resolution as f32;
    let mut bins = Vec::with_capacity(logz.len());
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in logz {
        let q = (v * res).round_ties_even();
        if !q.is_finite() {
            bail!("the points head gave a log-depth of {v}: the refiner cannot voxelise it");
        }
        lo = lo.min(q);
        hi = hi.max(q);
        bins.push(q);
    }
    // f32 bins are exact integers up to 2^24; a wider range is no photo's (e^65536 across it).
    if hi - lo >= (1u32 << 24) as f32 {
        bail!("the log-depth spans {} bins: beyond what the refiner voxelises (2^24)", hi - lo);
    }
    Ok(bins.into_iter().map(|q| (q - lo) as u32).collect())
}

impl Model {
    /// Whether the model is MoGe-3 (has a refiner).
    pub fn has_refiner(&self) -> bool {
        self.refiner.is_some()
    }

    /// MoGe-3's sparse U-Net.
    pub fn refiner(&self) -> Option<&super::sparse_unet::Sparse3DUNet> {
        self.refiner.as_ref()
    }

    /// The refine steps a call runs by default: upstream's 3 for MoGe-3, none for MoGe-2.
    pub fn default_refine_steps(&self) -> usize {
        if self.has_refiner() {
            DEFAULT_REFINE_STEPS
        } else {
            0
        }
    }

    /// `steps` refinements of `raw.points` in place (upstream's loop in `forward`), keeping the
    /// earlier maps in `raw.points_per_step` when `per_step`; the encoder map is the one the
    /// network left in `raw`. Fails on a MoGe-2 model asked for steps.
    pub fn refine(&self, raw: &mut RawOutput, steps: usize, per_step: bool) -> Result<()> {
        if steps == 0 {
            return Ok(());
        }
        let Some(refiner) = &self.refiner else {
            bail!("this is a MoGe-2 model, which has no refiner: refine steps need a MoGe-3 model");
        };
        if steps > MAX_REFINE_STEPS {
            bail!("{steps} refine steps: at most {MAX_REFINE_STEPS}");
        }
        // Borrowed beside the points the loop rewrites (disjoint fields of `raw`).
        let (Some(map), grid) = (raw.encoder_map.as_deref(), raw.grid) else {
            bail!("the network left no encoder map for the refiner");
        };
        let (h, w) = raw.size;
        let plane = h * w;
        for _ in 0..steps {
            let bins = depth_bins(&raw.points[2 * plane..3 * plane], self.config.refiner_depth_resolution)?;
            let voxels = Voxels::one_per_pixel(h, w, bins)?;
            let feats: Vec<f32> = (0..plane).flat_map(|p| [raw.points[p], raw.points[plane + p], raw.points[2 * plane + p]]).collect();
            let (delta, stats) = refiner.forward(&feats, &voxels, map, grid)?;
            if per_step {
                raw.points_per_step.push(raw.points.clone());
            }
            raw.points[2 * plane..].iter_mut().zip(&delta).for_each(|(z, d)| *z += d);
            raw.refiner.push(stats);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_bins_round_half_to_even_from_the_minimum() {
        // 0.5/256 · 256 = 0.5 → 0, 1.5/256 → 2, 2.5/256 → 2, −0.5/256 → −0 = 0.
        let logz = [0.5 / 256.0, 1.5 / 256.0, 2.5 / 256.0, -0.5 / 256.0, -3.0 / 256.0];
        assert_eq!(depth_bins(&logz, 256.0).unwrap(), vec![3, 5, 5, 3, 0]);
        assert!(depth_bins(&[0.0, f32::NAN], 256.0).unwrap_err().to_string().contains("NaN"));
        assert!(depth_bins(&[-1e5, 1e5], 256.0).unwrap_err().to_string().contains("bins"));
        assert_eq!(depth_bins(&[7.0; 4], 256.0).unwrap(), vec![0; 4], "a flat map is one bin");
    }
}
