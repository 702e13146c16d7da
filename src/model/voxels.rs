//! The sparse voxel sets of MoGe-3's refiner (what FlexGEMM's coords and caches are upstream):
//! voxels (i, j, z) of one image in raster order, as columns (i, j) holding ascending z. Memory
//! follows the voxels and the image's columns, never the depth extent, so a photo whose depth
//! range spans tens of thousands of bins costs what a flat one does.

use anyhow::{bail, Result};
use rayon::prelude::*;

use super::cpu::sparse_conv::{Neighbours, ABSENT, TAPS};

/// Active voxels over an (height × width × depth) grid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Voxels {
    pub height: usize,
    pub width: usize,
    /// The z extent (voxel z in 0..depth).
    pub depth: u64,
    /// The voxels of column c = i · width + j are `start[c]..start[c + 1]`.
    start: Vec<u32>,
    /// Each voxel's z, ascending within its column.
    z: Vec<u32>,
}

impl Voxels {
    /// One voxel per pixel (upstream's voxelisation): `z` in raster order.
    pub fn one_per_pixel(height: usize, width: usize, z: Vec<u32>) -> Result<Self> {
        let n = height * width;
        if z.len() != n {
            bail!("{} depth bins for a {width}x{height} map", z.len());
        }
        if n >= ABSENT as usize {
            bail!("a {width}x{height} map has more voxels than the refiner indexes");
        }
        let depth = z.iter().copied().max().map_or(0, |m| m as u64 + 1);
        Ok(Self { height, width, depth, start: (0..=n as u32).collect(), z })
    }

    pub fn len(&self) -> usize {
        self.z.len()
    }

    pub fn is_empty(&self) -> bool {
        self.z.is_empty()
    }

    /// Column index (i · width + j) of every voxel.
    pub fn columns(&self) -> Vec<u32> {
        let mut col = vec![0u32; self.len()];
        for (c, w) in self.start.windows(2).enumerate() {
            col[w[0] as usize..w[1] as usize].fill(c as u32);
        }
        col
    }

    /// Every voxel's (i, j, z), in order.
    pub fn coords(&self) -> Vec<[u32; 3]> {
        let col = self.columns();
        col.iter().zip(&self.z).map(|(&c, &z)| [c / self.width as u32, c % self.width as u32, z]).collect()
    }

    /// The 27-neighbour map of the submanifold convolutions at this level.
    pub fn neighbours(&self) -> Neighbours {
        let col = self.columns();
        let (h, w) = (self.height as i64, self.width as i64);
        let mut map = vec![ABSENT; self.len() * TAPS];
        map.par_chunks_mut(TAPS).enumerate().for_each(|(v, taps)| {
            let c = col[v] as i64;
            let (i, j, z) = (c / w, c % w, self.z[v] as i64);
            // Per neighbouring column, one search for z − 1, then its next voxels for z, z + 1
            // (taps 3·column + dz + 1).
            for (cn, slots) in taps.chunks_exact_mut(3).enumerate() {
                let (ni, nj) = (i + cn as i64 / 3 - 1, j + cn as i64 % 3 - 1);
                if !((0..h).contains(&ni) && (0..w).contains(&nj)) {
                    continue;
                }
                let c = (ni * w + nj) as usize;
                let (a, b) = (self.start[c] as usize, self.start[c + 1] as usize);
                let col = &self.z[a..b];
                let first = col.partition_point(|&q| (q as i64) < z - 1);
                for (k, &q) in col.iter().enumerate().skip(first).take(3) {
                    let dz = q as i64 - z;
                    if dz > 1 {
                        break;
                    }
                    slots[(dz + 1) as usize] = (a + k) as u32;
                }
            }
        });
        Neighbours::from_map(map)
    }

    /// The voxels of `coord // 2` (upstream's 2x pooling: i, j and z halved, duplicates merged,
    /// the grid ceil-halved), in raster order, and each voxel's parent among them.
    pub fn pooled(&self) -> (Voxels, Vec<u32>) {
        let (ph, pw) = (self.height.div_ceil(2), self.width.div_ceil(2));
        let mut start = Vec::with_capacity(ph * pw + 1);
        let mut z = Vec::with_capacity(self.len() / 2);
        let mut parent = vec![0u32; self.len()];
        let mut cell: Vec<u32> = Vec::new();
        start.push(0u32);
        for pi in 0..ph {
            for pj in 0..pw {
                cell.clear();
                let children = || {
                    (0..2)
                        .flat_map(move |a| (0..2).map(move |b| (2 * pi + a, 2 * pj + b)))
                        .filter(|&(i, j)| i < self.height && j < self.width)
                        .map(|(i, j)| i * self.width + j)
                };
                for c in children() {
                    let (a, b) = (self.start[c] as usize, self.start[c + 1] as usize);
                    cell.extend(self.z[a..b].iter().map(|&q| q >> 1));
                }
                cell.sort_unstable();
                cell.dedup();
                let base = z.len() as u32;
                for c in children() {
                    let (a, b) = (self.start[c] as usize, self.start[c + 1] as usize);
                    for (p, &q) in parent[a..b].iter_mut().zip(&self.z[a..b]) {
                        *p = base + cell.binary_search(&(q >> 1)).expect("each child's parent is in its cell") as u32;
                    }
                }
                z.extend_from_slice(&cell);
                start.push(z.len() as u32);
            }
        }
        (Voxels { height: ph, width: pw, depth: self.depth.div_ceil(2), start, z }, parent)
    }
}

/// Each parent's row of `x` (rows of `c`) the mean of its children's (upstream's mean pooling).
pub fn mean_pool(x: &[f32], c: usize, parent: &[u32], parents: usize) -> Vec<f32> {
    let mut sum = vec![0f32; parents * c];
    let mut count = vec![0u32; parents];
    for (row, &p) in x.chunks_exact(c).zip(parent) {
        let p = p as usize;
        sum[p * c..(p + 1) * c].iter_mut().zip(row).for_each(|(s, v)| *s += v);
        count[p] += 1;
    }
    sum.par_chunks_mut(c).zip(count.par_iter()).for_each(|(r, &n)| {
        let n = n.max(1) as f32;
        r.iter_mut().for_each(|v| *v /= n);
    });
    sum
}

/// Each child's row its parent's (upstream's nearest upsampling), plus the skip's row.
pub fn upsample_add(x: &[f32], c: usize, parent: &[u32], skip: &[f32]) -> Vec<f32> {
    let mut y = skip.to_vec();
    y.par_chunks_mut(c).zip(parent.par_iter()).for_each(|(r, &p)| {
        r.iter_mut().zip(&x[p as usize * c..(p as usize + 1) * c]).for_each(|(o, v)| *o += v);
    });
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::sparse_conv::CENTRE;

    fn voxels(h: usize, w: usize, f: impl Fn(usize, usize) -> u32) -> Voxels {
        Voxels::one_per_pixel(h, w, (0..h * w).map(|p| f(p / w, p % w)).collect()).unwrap()
    }

    /// Neighbours and pooling against a brute force over coordinates, on an odd-sized map with
    /// a steep ramp and plateaus (columns of several voxels after pooling).
    #[test]
    fn neighbours_and_pooling_match_brute_force() {
        let mut v = voxels(7, 9, |i, j| ((i * 3 + j * j) % 5 + (i / 3) * 2) as u32);
        for level in 0..4 {
            let coords = v.coords();
            let nb = v.neighbours();
            for (a, p) in coords.iter().enumerate() {
                for t in 0..TAPS {
                    let q = [p[0] as i64 + t as i64 / 9 - 1, p[1] as i64 + (t as i64 / 3) % 3 - 1, p[2] as i64 + t as i64 % 3 - 1];
                    let want = coords.iter().position(|c| c.map(|x| x as i64) == q).map_or(ABSENT, |u| u as u32);
                    assert_eq!(nb.of(a)[t], want, "level {level} voxel {a} tap {t}");
                }
                assert_eq!(nb.of(a)[CENTRE], a as u32);
            }
            let (up, parent) = v.pooled();
            let mut want: Vec<[u32; 3]> = coords.iter().map(|c| c.map(|x| x / 2)).collect();
            want.sort();
            want.dedup();
            assert_eq!(up.coords(), want, "level {level}: parents in raster order");
            for (c, &p) in coords.iter().zip(&parent) {
                assert_eq!(up.coords()[p as usize], c.map(|x| x / 2));
            }
            assert_eq!((up.height, up.width, up.depth), (v.height.div_ceil(2), v.width.div_ceil(2), v.depth.div_ceil(2)));
            v = up;
        }
    }

    #[test]
    fn pooling_means_and_upsampling_copies() {
        let v = voxels(2, 3, |_, j| j as u32 * 2);
        let (up, parent) = v.pooled();
        assert_eq!(up.coords(), vec![[0, 0, 0], [0, 0, 1], [0, 1, 2]]);
        let x: Vec<f32> = (0..6).flat_map(|p| [p as f32, 10.0 * p as f32]).collect();
        let m = mean_pool(&x, 2, &parent, up.len());
        // Parent 0 holds pixels (0,0) and (1,0): rows 0 and 3.
        assert_eq!(m, vec![1.5, 15.0, 2.5, 25.0, 3.5, 35.0]);
        let y = upsample_add(&m, 2, &parent, &[1.0; 12]);
        assert_eq!(&y[..4], &[2.5, 16.0, 3.5, 26.0]);
    }

    /// Memory follows voxels, not the depth extent: a map spanning four billion bins.
    #[test]
    fn a_huge_depth_range_costs_no_memory() {
        let v = voxels(4, 4, |i, j| if (i + j) % 2 == 0 { 0 } else { u32::MAX - 1 });
        assert_eq!(v.depth, u32::MAX as u64);
        let nb = v.neighbours();
        // Each voxel itself and its diagonal neighbours, which share its bin: 36 ordered pairs.
        assert_eq!(nb.pairs(), 16 + 36);
        let (up, _) = v.pooled();
        assert_eq!(up.len(), 8);
    }
}
