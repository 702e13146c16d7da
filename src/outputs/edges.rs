//! The surface shared by the ply and glb outputs, built as upstream `moge infer` does
//! (`infer.py` with utils3d): drop pixels on depth edges, keep the 2x2 pixel blocks whose
//! four corners are valid, split each into two triangles, keep only the pixels the triangles
//! use, then convert to OpenGL axes (y and z negated, v flipped).

use image::RgbImage;

use crate::geometry::edges::depth_edge;
use crate::geometry::uv::linspace;
use crate::infer::Prediction;

/// `mask & !depth_edge(depth, rtol)` ([`depth_edge`]): a pixel is an edge when the depth range
/// over its 3x3 neighbourhood (inside the image) divided by its depth exceeds `rtol`. A masked
/// (+inf) neighbour makes the range infinite, so the pixels along the mask border go too; NaN
/// comparisons are false, as in numpy.
pub fn clean_mask(depth: &[f32], mask: &[bool], width: usize, height: usize, rtol: f32) -> Vec<bool> {
    mask.iter().zip(depth_edge(depth, width, height, rtol)).map(|(&m, edge)| m && !edge).collect()
}

/// Vertices (used pixels in row-major order) and triangles, in OpenGL axes.
pub struct Surface {
    /// x, y, z per vertex: camera points with y and z negated.
    pub positions: Vec<[f32; 3]>,
    /// Normals with y and z negated; None without a normal head.
    pub normals: Option<Vec<[f32; 3]>>,
    /// (u, 1 − v) of the pixel centre.
    pub uvs: Vec<[f32; 2]>,
    /// The photo's colour at the pixel.
    pub colors: Vec<[u8; 3]>,
    pub triangles: Vec<[u32; 3]>,
}

impl Surface {
    /// A photo's surface: `image` must have the prediction's size.
    pub fn build(pred: &Prediction, image: &RgbImage, rtol: f32) -> Surface {
        Surface::from_mask(pred, image, &clean_mask(&pred.depth, &pred.mask, pred.width, pred.height, rtol))
    }

    /// The surface over the pixels of `mask` (one per pixel of the prediction).
    pub fn from_mask(pred: &Prediction, image: &RgbImage, mask: &[bool]) -> Surface {
        let (w, h) = (pred.width, pred.height);
        debug_assert_eq!((image.width() as usize, image.height() as usize), (w, h));
        debug_assert_eq!(mask.len(), w * h);
        // Quads (TL, BL, BR, TR) with all four corners valid → (TL, BL, BR), (TL, BR, TR).
        let mut used = vec![false; w * h];
        let mut quads = Vec::new();
        for y in 0..h.saturating_sub(1) {
            for x in 0..w.saturating_sub(1) {
                let tl = y * w + x;
                let (bl, br, tr) = (tl + w, tl + w + 1, tl + 1);
                if mask[tl] && mask[bl] && mask[br] && mask[tr] {
                    for p in [tl, bl, br, tr] {
                        used[p] = true;
                    }
                    quads.push([tl, bl, br, tr]);
                }
            }
        }
        // Re-index: vertices are the used pixels in ascending pixel index.
        let mut index = vec![u32::MAX; w * h];
        let (us, vs) = (linspace(0.5 / w as f64, 1.0 - 0.5 / w as f64, w), linspace(0.5 / h as f64, 1.0 - 0.5 / h as f64, h));
        let raw = image.as_raw();
        let mut s = Surface {
            positions: Vec::new(),
            normals: pred.normal.as_ref().map(|_| Vec::new()),
            uvs: Vec::new(),
            colors: Vec::new(),
            triangles: Vec::with_capacity(2 * quads.len()),
        };
        for p in (0..w * h).filter(|&p| used[p]) {
            index[p] = s.positions.len() as u32;
            let q = &pred.points[3 * p..3 * p + 3];
            s.positions.push([q[0], -q[1], -q[2]]);
            if let (Some(n), Some(out)) = (&pred.normal, s.normals.as_mut()) {
                out.push([n[3 * p], -n[3 * p + 1], -n[3 * p + 2]]);
            }
            s.uvs.push([us[p % w], 1.0 - vs[p / w]]);
            s.colors.push([raw[3 * p], raw[3 * p + 1], raw[3 * p + 2]]);
        }
        for [tl, bl, br, tr] in quads {
            let (tl, bl, br, tr) = (index[tl], index[bl], index[br], index[tr]);
            s.triangles.push([tl, bl, br]);
            s.triangles.push([tl, br, tr]);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_pixels_and_mask_border_are_removed() {
        // 5x4 plane at depth 1 with a step to 2 in the last column and one masked pixel.
        let (w, h) = (5, 4);
        let mut depth = vec![1.0f32; w * h];
        for y in 0..h {
            depth[y * w + 4] = 2.0;
        }
        let mut mask = vec![true; w * h];
        mask[0] = false;
        depth[0] = f32::INFINITY;
        let m = clean_mask(&depth, &mask, w, h, 0.04);
        // The masked pixel and its neighbours go (inf range); columns 3 and 4 straddle the step.
        let expect = |x: usize, y: usize| !((x <= 1 && y <= 1) || x >= 3);
        for y in 0..h {
            for x in 0..w {
                assert_eq!(m[y * w + x], expect(x, y), "pixel ({x},{y})");
            }
        }
        // rtol = inf keeps every valid pixel, even beside the masked one.
        let m = clean_mask(&depth, &mask, w, h, f32::INFINITY);
        assert_eq!(m, mask);
    }
}
