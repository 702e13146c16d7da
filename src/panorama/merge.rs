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
use super::lsmr::{lsmr, Operator, Stop};
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
    if width < 2 || height < 2 {
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
            median(&mut diffs)
        })
        .collect();
    Ok(m)
}

/// numpy's median (the mean of the two middle values of an even count); NaN for none.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
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
    let mut row_ptr = vec![0usize];
    let mut cols: Vec<u32> = Vec::new();
    let mut vals: Vec<f32> = Vec::new();
    let mut b: Vec<f64> = Vec::new();
    let mut push = |entries: &mut Vec<(u32, f32)>, target: f64| {
        entries.sort_unstable_by_key(|e| e.0);
        let start = cols.len();
        for &(c, v) in entries.iter() {
            if cols.len() > start && *cols.last().expect("a column") == c {
                *vals.last_mut().expect("a value") += v;
            } else {
                cols.push(c);
                vals.push(v);
            }
        }
        row_ptr.push(cols.len());
        b.push(target);
        entries.clear();
    };
    let mean = |sum: f32, count: u16| sum as f64 / (count as f64).max(1e-3);
    let mut e = Vec::with_capacity(5);
    for i in 0..n {
        if gx_n[i] > 0 {
            e.extend([(i as u32, 1.0), (g.right(i) as u32, -1.0)]);
            push(&mut e, mean(gx[i], gx_n[i]));
        }
    }
    for y in 0..h - 1 {
        for x in 0..=w {
            let i = y * w + x % w;
            if gy_n[i] > 0 {
                e.extend([(i as u32, 1.0), ((i + w) as u32, -1.0)]);
                push(&mut e, mean(gy[i], gy_n[i]));
            }
        }
    }
    for i in 0..n {
        if lap_n[i] > 0 {
            let (up, down, lf, r) = (g.up(i), g.down(i), g.left(i), g.right(i));
            e.extend([(i as u32, -4.0), (up as u32, 1.0), (down as u32, 1.0), (lf as u32, 1.0), (r as u32, 1.0)]);
            push(&mut e, mean(lap[i], lap_n[i]));
        }
    }
    let rows = b.len();

    let a = Csr { row_ptr, cols, vals, cols_n: n };
    let at = a.transpose();
    let system = System { a, at };
    let mut x = match &init {
        Some(init) => init.iter().map(|&v| v.ln() as f64).collect(),
        None => vec![0.0; n],
    };
    let its = if rows > 0 { lsmr(&system, &b, &mut x, stop).iterations } else { 0 };
    iterations.push(its);
    let distance: Vec<f32> = x.iter().map(|&v| v.exp() as f32).collect();
    Ok(Merged { width: w, height: h, distance, mask: any, log_offsets: Vec::new(), iterations: Vec::new() })
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

/// A sparse matrix by rows; its entries are small integers (the stencils' weights).
struct Csr {
    row_ptr: Vec<usize>,
    cols: Vec<u32>,
    vals: Vec<f32>,
    cols_n: usize,
}

impl Csr {
    fn rows(&self) -> usize {
        self.row_ptr.len() - 1
    }

    fn transpose(&self) -> Csr {
        let mut count = vec![0usize; self.cols_n + 1];
        for &c in &self.cols {
            count[c as usize + 1] += 1;
        }
        for i in 0..self.cols_n {
            count[i + 1] += count[i];
        }
        let row_ptr = count.clone();
        let mut next = count;
        let mut cols = vec![0u32; self.cols.len()];
        let mut vals = vec![0f32; self.vals.len()];
        for r in 0..self.rows() {
            for k in self.row_ptr[r]..self.row_ptr[r + 1] {
                let c = self.cols[k] as usize;
                cols[next[c]] = r as u32;
                vals[next[c]] = self.vals[k];
                next[c] += 1;
            }
        }
        Csr { row_ptr, cols, vals, cols_n: self.rows() }
    }

    /// `out = self · x`, rows in parallel.
    fn apply(&self, x: &[f64], out: &mut [f64]) {
        out.par_chunks_mut(4096).enumerate().for_each(|(chunk, o)| {
            for (k, v) in o.iter_mut().enumerate() {
                let r = chunk * 4096 + k;
                let (a, b) = (self.row_ptr[r], self.row_ptr[r + 1]);
                *v = self.cols[a..b].iter().zip(&self.vals[a..b]).map(|(&c, &w)| w as f64 * x[c as usize]).sum();
            }
        });
    }
}

/// The system and its transpose, each by rows, so both products run row-parallel.
struct System {
    a: Csr,
    at: Csr,
}

impl Operator for System {
    fn rows(&self) -> usize {
        self.a.rows()
    }
    fn cols(&self) -> usize {
        self.a.cols_n
    }
    fn apply(&self, x: &[f64], out: &mut [f64]) {
        self.a.apply(x, out)
    }
    fn apply_transpose(&self, u: &[f64], out: &mut [f64]) {
        self.at.apply(u, out)
    }
}
