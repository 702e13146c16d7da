//! `merge_panorama_depth`: the views' distance maps as one equirectangular distance map.
//!
//! As upstream does it: each view's log distance and mask are warped onto the panorama; their
//! horizontal and vertical differences and 5-point Laplacians, averaged over the views that see
//! both ends, are the targets of an overdetermined sparse system in the panorama's log distance
//! (wrapping around horizontally), solved in the least-squares sense by LSMR from the solution
//! at half the size, upsampled (the coarsest level, at most 256 wide and high, starts from 0).
//! The equations are upstream's row for row, the vertical ones included over the wrapped
//! column upstream pads (column 0's twice), and so are the solver's stopping rules (scipy's
//! LSMR at upstream's tolerances: [`super::lsmr`]).
//!
//! The equations fix only differences, so the map's scale is the start's: moge then measures,
//! per view, the median of log(view distance) − log(merged) where the view sees, for
//! [`Merged::log_offsets`] (the metric scale the caller carries into the map).

use anyhow::{bail, Result};
use rayon::prelude::*;

use super::cameras::{grid_directions, View};
use super::lsmr::{in_order, lsmr, Operator, Stop};
use crate::geometry::remap;
use crate::geometry::resize::resize_bilinear;

/// Levels coarser than this (both sides) are solved from zero (`merge_panorama_depth`'s 256).
const COARSEST: usize = 256;

/// One view's prediction, as the merge takes it: `size` x `size` distances (the norm of the
/// unmasked points) and the model's mask.
#[derive(Debug, Clone, Copy)]
pub struct ViewDistance<'a> {
    pub size: usize,
    pub distance: &'a [f32],
    pub mask: &'a [bool],
}

/// The merged map at the merge's size, in the scale of the solve (see the module).
#[derive(Debug, Clone)]
pub struct Merged {
    pub width: usize,
    pub height: usize,
    /// exp of the solution, row-major, every pixel.
    pub distance: Vec<f32>,
    /// Where any view's mask is set.
    pub mask: Vec<bool>,
    /// Per view: median of log(view distance) − log(merged) over the pixels where it sees and
    /// its mask is set; NaN where there are none.
    pub log_offsets: Vec<f64>,
    /// LSMR's iterations per level, coarsest first.
    pub iterations: Vec<usize>,
}

/// A view warped onto the panorama: its log distance (0 where it does not see) and its mask.
struct Warped {
    log: Vec<f32>,
    mask: Vec<bool>,
}

fn warp(view: &View, d: &ViewDistance, log_view: &[f32], mask_view: &[u8], dirs: &[[f32; 3]]) -> Warped {
    let n = d.size;
    let (log, mask): (Vec<f32>, Vec<bool>) = dirs
        .par_iter()
        .map(|&dir| {
            let (u, v, depth) = view.project(dir.map(|c| c as f64));
            let sees = depth > 0.0 && u > 0.0 && u < 1.0 && v > 0.0 && v < 1.0;
            if !sees {
                return (0.0, false);
            }
            let x = (u.clamp(0.0, 1.0) * n as f64 - 0.5) as f32;
            let y = (v.clamp(0.0, 1.0) * n as f64 - 0.5) as f32;
            (remap::f32_linear_at(log_view, n, n, x, y), remap::u8_nearest_replicate_at(mask_view, n, n, x, y) > 0)
        })
        .unzip();
    Warped { log, mask }
}

/// Each view's log distance (float32, as `np.log`) and mask as bytes. A distance that is not a
/// positive number (a degenerate prediction) is masked and its log taken as 0.
fn prepare(d: &ViewDistance) -> (Vec<f32>, Vec<u8>) {
    d.distance.iter().zip(d.mask).map(|(&v, &m)| if v.is_finite() && v > 0.0 { (v.ln(), m as u8) } else { (0.0, 0) }).unzip()
}

/// The merged map of `views` at `width` x `height` (upstream calls it at min(1920, W) x
/// min(960, H)).
pub fn merge(width: usize, height: usize, cams: &[View], views: &[ViewDistance], stop: &Stop) -> Result<Merged> {
    if cams.len() != views.len() || views.is_empty() {
        bail!("{} views for {} cameras", views.len(), cams.len());
    }
    if width < 3 || height < 2 {
        bail!("a {width}x{height} merge is too small");
    }
    for v in views {
        if v.size == 0 || v.distance.len() != v.size * v.size || v.mask.len() != v.size * v.size {
            bail!("a view's maps are not {0} x {0}", v.size);
        }
    }
    let prepared: Vec<_> = views.iter().map(prepare).collect();
    let mut iterations = Vec::new();
    let mut m = level(width, height, cams, views, &prepared, stop, &mut iterations)?;
    m.iterations = iterations;
    // The offsets at the merge's size, against the final map.
    let dirs = grid_directions(width, height);
    m.log_offsets = cams
        .iter()
        .zip(views)
        .zip(&prepared)
        .map(|((cam, d), (log, mask))| {
            let w = warp(cam, d, log, mask, &dirs);
            let mut diffs: Vec<f64> = (0..width * height).filter(|&i| w.mask[i]).map(|i| w.log[i] as f64 - (m.distance[i].ln()) as f64).collect();
            crate::geometry::median(&mut diffs)
        })
        .collect();
    Ok(m)
}

fn level(
    width: usize,
    height: usize,
    cams: &[View],
    views: &[ViewDistance],
    prepared: &[(Vec<f32>, Vec<u8>)],
    stop: &Stop,
    iterations: &mut Vec<usize>,
) -> Result<Merged> {
    let init = if width.max(height) > COARSEST {
        let (cw, ch) = (width / 2, height / 2);
        let coarse = level(cw, ch, cams, views, prepared, stop, iterations)?;
        Some(resize_bilinear(&coarse.distance, 1, ch, cw, height, width))
    } else {
        None
    };
    let (w, h) = (width, height);
    if w < 3 || h == 0 {
        bail!("a {w}x{h} level of the merge is too small: its columns' neighbours coincide");
    }
    let n = w * h;
    let g = Grid { w, n };
    let dirs = grid_directions(w, h);

    // Targets summed over the views and the views counted, as upstream's masked means.
    let mut gx = vec![0f32; n];
    let mut gx_n = vec![0u16; n];
    let mut gy = vec![0f32; (h - 1) * w];
    let mut gy_n = vec![0u16; (h - 1) * w];
    let mut lap = vec![0f32; n];
    let mut lap_n = vec![0u16; n];
    let mut any = vec![false; n];
    for ((cam, d), (log, mask)) in cams.iter().zip(views).zip(prepared) {
        let wp = warp(cam, d, log, mask, &dirs);
        let (l, m) = (&wp.log, &wp.mask);
        for i in 0..n {
            any[i] |= m[i];
            let r = g.right(i);
            if m[i] && m[r] {
                gx[i] += l[i] - l[r];
                gx_n[i] += 1;
            }
            if i + w < n && m[i] && m[i + w] {
                gy[i] += l[i] - l[i + w];
                gy_n[i] += 1;
            }
            let (up, down, lf) = (g.up(i), g.down(i), g.left(i));
            if m[i] && m[up] && m[down] && m[lf] && m[r] {
                let s = l[up] as f64 + l[down] as f64 + l[lf] as f64 + l[r] as f64 - 4.0 * l[i] as f64;
                lap[i] += s as f32;
                lap_n[i] += 1;
            }
        }
    }

    // The system, row by row in upstream's order: x differences, y differences (on the
    // (W + 1)-column grid upstream pads, its last column repeating column 0), Laplacians.
    let mean = |sum: f32, count: u16| sum as f64 / (count as f64).max(1e-3);
    let mut st = Stencils::new(w, h);
    let mut b: Vec<f64> = Vec::new();
    for i in 0..n {
        if gx_n[i] > 0 {
            st.rx[i] = b.len() as u32;
            st.xrows.push(st.tagged(i));
            b.push(mean(gx[i], gx_n[i]));
        }
    }
    for y in 0..h - 1 {
        for x in 0..=w {
            let i = y * w + x % w;
            if gy_n[i] > 0 {
                if x < w {
                    st.ry[i] = b.len() as u32;
                } else {
                    st.ry_wrap[y] = b.len() as u32;
                }
                st.yrows.push(i as u32);
                b.push(mean(gy[i], gy_n[i]));
            }
        }
    }
    for i in 0..n {
        if lap_n[i] > 0 {
            st.rl[i] = b.len() as u32;
            st.lrows.push(st.tagged(i));
            b.push(mean(lap[i], lap_n[i]));
        }
    }
    let rows = b.len();

    let mut x = match &init {
        Some(init) => init.iter().map(|&v| v.ln() as f64).collect(),
        None => vec![0.0; n],
    };
    let its = if rows > 0 { lsmr(&st, &b, &mut x, stop).iterations } else { 0 };
    iterations.push(its);
    let distance: Vec<f32> = x.iter().map(|&v| v.exp() as f32).collect();
    Ok(Merged { width: w, height: h, distance, mask: any, log_offsets: Vec::new(), iterations: Vec::new() })
}

/// `o = k·value(row) − s·o` over a task's rows, and the sum of the squares.
fn sub_rows(o: &mut [f64], rows: &[u32], k: f64, s: f64, value: impl Fn(u32) -> f64) -> f64 {
    let mut sum = 0.0;
    for (o, &t) in o.iter_mut().zip(rows) {
        *o = k * value(t) - s * *o;
        sum += *o * *o;
    }
    sum
}

/// Neighbours on the panorama's grid, as upstream pads it: columns wrap around, the rows
/// beyond the poles repeat the edge row ('edge' padding).
struct Grid {
    w: usize,
    n: usize,
}

impl Grid {
    fn right(&self, i: usize) -> usize {
        if (i + 1).is_multiple_of(self.w) {
            i + 1 - self.w
        } else {
            i + 1
        }
    }
    fn left(&self, i: usize) -> usize {
        if i.is_multiple_of(self.w) {
            i + self.w - 1
        } else {
            i - 1
        }
    }
    fn up(&self, i: usize) -> usize {
        if i >= self.w {
            i - self.w
        } else {
            i
        }
    }
    fn down(&self, i: usize) -> usize {
        if i + self.w < self.n {
            i + self.w
        } else {
            i
        }
    }
}

/// No row index.
const NONE: u32 = u32::MAX;

/// The system without a matrix: every row is a stencil at a pixel (x difference, y difference
/// or Laplacian, weights ±1 and −4), so a product reads the pixels and the rows' indices only.
struct Stencils {
    g: Grid,
    h: usize,
    /// The pixel of each row of each kind, in the rows' order; x and Laplacian rows' tagged
    /// with [`FIRST`] / [`LAST`] where the pixel is in the first / last column.
    xrows: Vec<u32>,
    yrows: Vec<u32>,
    lrows: Vec<u32>,
    /// Per pixel its row of each kind, or [`NONE`]; `ry_wrap[y]`: the second y row of column 0
    /// (upstream's padded column).
    rx: Vec<u32>,
    ry: Vec<u32>,
    ry_wrap: Vec<u32>,
    rl: Vec<u32>,
}

/// Rows or pixels per parallel task.
const CHUNK: usize = 1 << 14;

/// Tags of a row's pixel: in the first column, in the last; the rest is the pixel.
const FIRST: u32 = 1 << 31;
const LAST: u32 = 1 << 30;
const PIXEL: u32 = LAST - 1;

impl Stencils {
    /// `w` >= 3: fewer columns would make a pixel its own left or right neighbour.
    fn new(w: usize, h: usize) -> Self {
        let n = w * h;
        Stencils {
            g: Grid { w, n },
            h,
            xrows: Vec::new(),
            yrows: Vec::new(),
            lrows: Vec::new(),
            rx: vec![NONE; n],
            ry: vec![NONE; n],
            ry_wrap: vec![NONE; h],
            rl: vec![NONE; n],
        }
    }

    /// Pixel `i` with its column's tags, so that the products need no division.
    fn tagged(&self, i: usize) -> u32 {
        let col = i % self.g.w;
        i as u32 | if col == 0 { FIRST } else { 0 } | if col + 1 == self.g.w { LAST } else { 0 }
    }
}

impl Operator for Stencils {
    fn rows(&self) -> usize {
        self.xrows.len() + self.yrows.len() + self.lrows.len()
    }

    fn cols(&self) -> usize {
        self.g.n
    }

    fn apply(&self, x: &[f64], out: &mut [f64]) {
        out.fill(0.0);
        self.apply_sub(x, 1.0, 0.0, out);
    }

    fn apply_transpose(&self, u: &[f64], out: &mut [f64]) {
        out.fill(0.0);
        self.apply_transpose_sub(u, 1.0, 0.0, out);
    }

    fn apply_sub(&self, x: &[f64], k: f64, s: f64, out: &mut [f64]) -> f64 {
        let (w, n) = (self.g.w, self.g.n);
        let (ox, rest) = out.split_at_mut(self.xrows.len());
        let (oy, ol) = rest.split_at_mut(self.yrows.len());
        let x_rows = |t: u32| {
            let p = (t & PIXEL) as usize;
            x[p] - x[if t & LAST != 0 { p + 1 - w } else { p + 1 }]
        };
        let y_rows = |p: u32| x[p as usize] - x[p as usize + w];
        let l_rows = |t: u32| {
            let p = (t & PIXEL) as usize;
            let up = if p >= w { p - w } else { p };
            let down = if p + w < n { p + w } else { p };
            let left = if t & FIRST != 0 { p + w - 1 } else { p - 1 };
            let right = if t & LAST != 0 { p + 1 - w } else { p + 1 };
            x[up] + x[down] + x[left] + x[right] - 4.0 * x[p]
        };
        let mut parts: Vec<f64> = ox.par_chunks_mut(CHUNK).zip(self.xrows.par_chunks(CHUNK)).map(|(o, px)| sub_rows(o, px, k, s, x_rows)).collect();
        parts.extend(oy.par_chunks_mut(CHUNK).zip(self.yrows.par_chunks(CHUNK)).map(|(o, px)| sub_rows(o, px, k, s, y_rows)).collect::<Vec<_>>());
        parts.extend(ol.par_chunks_mut(CHUNK).zip(self.lrows.par_chunks(CHUNK)).map(|(o, px)| sub_rows(o, px, k, s, l_rows)).collect::<Vec<_>>());
        in_order(parts).sqrt()
    }

    fn apply_transpose_sub(&self, u: &[f64], k: f64, s: f64, out: &mut [f64]) -> f64 {
        let (w, h) = (self.g.w, self.h);
        let at = |r: u32| if r == NONE { 0.0 } else { u[r as usize] };
        // A task per picture row, so that the row and the column are known without division.
        let parts = out
            .par_chunks_mut(w)
            .enumerate()
            .map(|(y, o)| {
                let mut sum = 0.0;
                for (col, o) in o.iter_mut().enumerate() {
                    let p = y * w + col;
                    let left = if col == 0 { p + w - 1 } else { p - 1 };
                    let right = if col + 1 == w { p + 1 - w } else { p + 1 };
                    // x[p] − x[right p] at p, x[left p] − x[p] at its left neighbour.
                    let mut v = at(self.rx[p]) - at(self.rx[left]);
                    // x[p] − x[p + W] at p, x[p − W] − x[p] above (column 0's twice).
                    if y + 1 < h {
                        v += at(self.ry[p]);
                        if col == 0 {
                            v += at(self.ry_wrap[y]);
                        }
                    }
                    if y > 0 {
                        v -= at(self.ry[p - w]);
                        if col == 0 {
                            v -= at(self.ry_wrap[y - 1]);
                        }
                    }
                    // Its own Laplacian (a pole row counts itself as its missing neighbour),
                    // and its four neighbours'.
                    let own = -4.0 + f64::from(u8::from(y == 0)) + f64::from(u8::from(y + 1 == h));
                    v += own * at(self.rl[p]) + at(self.rl[left]) + at(self.rl[right]);
                    if y > 0 {
                        v += at(self.rl[p - w]);
                    }
                    if y + 1 < h {
                        v += at(self.rl[p + w]);
                    }
                    *o = k * v - s * *o;
                    sum += *o * *o;
                }
                sum
            })
            .collect();
        in_order(parts).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stencils' products against the matrix they stand for, built entry by entry.
    #[test]
    fn the_stencils_products_are_the_systems_matrix_and_its_transpose() {
        let (w, h) = (7, 5);
        let n = w * h;
        let mut st = Stencils::new(w, h);
        let g = Grid { w, n };
        let mut dense: Vec<Vec<f64>> = Vec::new();
        let row = |dense: &mut Vec<Vec<f64>>, entries: &[(usize, f64)]| {
            let mut r = vec![0.0; n];
            for &(c, v) in entries {
                r[c] += v;
            }
            dense.push(r);
        };
        // Some pixels without rows of a kind, as masks leave them.
        let keep = |i: usize, salt: usize| !(i * 7 + salt).is_multiple_of(5);
        for i in (0..n).filter(|&i| keep(i, 1)) {
            st.rx[i] = dense.len() as u32;
            st.xrows.push(st.tagged(i));
            row(&mut dense, &[(i, 1.0), (g.right(i), -1.0)]);
        }
        for y in 0..h - 1 {
            for x in 0..=w {
                let i = y * w + x % w;
                if keep(i, 2) {
                    if x < w {
                        st.ry[i] = dense.len() as u32;
                    } else {
                        st.ry_wrap[y] = dense.len() as u32;
                    }
                    st.yrows.push(i as u32);
                    row(&mut dense, &[(i, 1.0), (i + w, -1.0)]);
                }
            }
        }
        for i in (0..n).filter(|&i| keep(i, 3)) {
            st.rl[i] = dense.len() as u32;
            st.lrows.push(st.tagged(i));
            row(&mut dense, &[(i, -4.0), (g.up(i), 1.0), (g.down(i), 1.0), (g.left(i), 1.0), (g.right(i), 1.0)]);
        }
        let m = dense.len();
        assert_eq!(st.rows(), m);
        let x: Vec<f64> = (0..n).map(|i| ((i * 37 % 11) as f64 - 5.0) * 0.3).collect();
        let u: Vec<f64> = (0..m).map(|i| ((i * 13 % 7) as f64 - 3.0) * 0.7).collect();
        let (mut ax, mut atu) = (vec![0.0; m], vec![0.0; n]);
        st.apply(&x, &mut ax);
        st.apply_transpose(&u, &mut atu);
        for r in 0..m {
            let want: f64 = (0..n).map(|c| dense[r][c] * x[c]).sum();
            assert!((ax[r] - want).abs() < 1e-12, "row {r}: {} vs {want}", ax[r]);
        }
        for c in 0..n {
            let want: f64 = (0..m).map(|r| dense[r][c] * u[r]).sum();
            assert!((atu[c] - want).abs() < 1e-12, "column {c}: {} vs {want}", atu[c]);
        }
    }

    #[test]
    fn degenerate_sizes_are_errors_or_maps_never_panics() {
        let (size, d, m) = (8, vec![2.0f32; 64], vec![true; 64]);
        let views: Vec<_> = (0..12).map(|_| ViewDistance { size, distance: &d, mask: &m }).collect();
        let cams = crate::panorama::cameras::views();
        let stop = Stop::UPSTREAM;
        assert!(merge(2, 2, &cams, &views, &stop).unwrap_err().to_string().contains("too small"));
        // A tall, narrow merge halves to two columns before it is coarse enough.
        assert!(merge(4, 600, &cams, &views, &stop).is_err());
        // A wide, flat one halves to one row: a map, and constant views give a constant map.
        let flat = merge(600, 4, &cams, &views, &stop).unwrap();
        assert_eq!(flat.distance.len(), 2400);
        // (the bilinear weights' products round, so the warped logs differ by an ulp here and there)
        assert!(flat.distance.iter().all(|&v| (v / flat.distance[0] - 1.0).abs() < 1e-5));
        // The views are 2 m everywhere they see: the scale carried into the map makes it 2 m.
        let a = crate::panorama::assemble(&flat, 600, 4);
        assert!((a.scale - 2.0 / flat.distance[0]).abs() < 1e-5, "{}", a.scale);
        assert!(merge(8, 4, &cams, &views[..3], &stop).is_err());
    }
}
