//! utils3d's `depth_map_edge(depth, rtol)` (without a mask): the test both meshes start from,
//! a photo's (`outputs::edges`) and a panorama's (`panorama::edges`).

/// Per pixel: the depth range over its 3x3 neighbourhood inside the picture, divided by its
/// depth, above `rtol` (in f32). max/min ignore NaN, as torch's max_pool and numpy's nanmax; a
/// +inf neighbour (a masked pixel's) makes the range infinite.
pub fn depth_edge(depth: &[f32], width: usize, height: usize, rtol: f32) -> Vec<bool> {
    let mut edge = vec![false; width * height];
    for y in 0..height {
        for x in 0..width {
            let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
            for yy in y.saturating_sub(1)..(y + 2).min(height) {
                for xx in x.saturating_sub(1)..(x + 2).min(width) {
                    let d = depth[yy * width + xx];
                    if !d.is_nan() {
                        lo = lo.min(d);
                        hi = hi.max(d);
                    }
                }
            }
            edge[y * width + x] = (hi - lo) / depth[y * width + x] > rtol;
        }
    }
    edge
}
