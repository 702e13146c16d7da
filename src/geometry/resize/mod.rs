//! PyTorch CPU interpolation, reproduced in float32 the way PyTorch computes it (coordinates
//! and weights in float32; a float64 version differs from PyTorch's by up to 1e-4).
//! Images are planar: `c` planes of `h·w` row-major floats.

/// One output index of a separable filter: first source index and its weights.
#[derive(Debug, Clone)]
struct Taps {
    start: usize,
    weights: Vec<f32>,
}

/// One output index of a plain bilinear resize: the two source indices and their weights.
pub type BilinearTap = (usize, usize, f32, f32);

/// `F.interpolate(mode='bilinear', align_corners=False, antialias=False)` weights for one axis.
pub fn bilinear_axis(input: usize, output: usize) -> Vec<BilinearTap> {
    let scale = input as f32 / output as f32;
    (0..output)
        .map(|dst| {
            let mut src = scale * (dst as f32 + 0.5) - 0.5;
            if src < 0.0 {
                src = 0.0;
            }
            let i0 = src as usize;
            let i1 = i0 + usize::from(i0 < input - 1);
            let l1 = (src - i0 as f32).clamp(0.0, 1.0);
            (i0, i1, 1.0 - l1, l1)
        })
        .collect()
}

/// Plain bilinear resize (no antialias), as `F.interpolate(..., antialias=False)`.
pub fn resize_bilinear(src: &[f32], c: usize, h: usize, w: usize, oh: usize, ow: usize) -> Vec<f32> {
    assert_eq!(src.len(), c * h * w);
    let ys = bilinear_axis(h, oh);
    let xs = bilinear_axis(w, ow);
    let mut out = vec![0f32; c * oh * ow];
    for ch in 0..c {
        let plane = &src[ch * h * w..(ch + 1) * h * w];
        let dst = &mut out[ch * oh * ow..(ch + 1) * oh * ow];
        for (oy, &(y0, y1, wy0, wy1)) in ys.iter().enumerate() {
            let r0 = &plane[y0 * w..(y0 + 1) * w];
            let r1 = &plane[y1 * w..(y1 + 1) * w];
            let row = &mut dst[oy * ow..(oy + 1) * ow];
            for (o, &(x0, x1, wx0, wx1)) in row.iter_mut().zip(&xs) {
                // Same association as PyTorch's 2-D kernel: interpolate each row along x, then y.
                let t0 = r0[x0] * wx0 + r0[x1] * wx1;
                let t1 = r1[x0] * wx0 + r1[x1] * wx1;
                *o = t0 * wy0 + t1 * wy1;
            }
        }
    }
    out
}

/// One value of [`resize_bilinear`] of a plane, bit for bit: pixel (`x`, `y`) of the output.
#[inline]
pub fn bilinear_at(plane: &[f32], w: usize, (x0, x1, wx0, wx1): BilinearTap, (y0, y1, wy0, wy1): BilinearTap) -> f32 {
    let (r0, r1) = (&plane[y0 * w..(y0 + 1) * w], &plane[y1 * w..(y1 + 1) * w]);
    let t0 = r0[x0] * wx0 + r0[x1] * wx1;
    let t1 = r1[x0] * wx0 + r1[x1] * wx1;
    t0 * wy0 + t1 * wy1
}

/// [`resize_bilinear`] of one plane, an output row at a time, with the same values bit for bit.
/// Each source row is interpolated along x once and kept while output rows read it (an upsample
/// by k reads every source row k times), and the vertical blend runs over whole rows, which the
/// compiler vectorises; the post-processing builds the full-size maps a row at a time from these.
pub struct BilinearRows<'a> {
    plane: &'a [f32],
    w: usize,
    xs: &'a ColumnTaps,
    /// Source row index held by each slot, and its x-interpolated values.
    held: [Option<usize>; 2],
    rows: [Vec<f32>; 2],
}

/// The output columns' taps of [`BilinearRows`] (from `bilinear_axis(w, ow)`), one array per
/// field: the loop over them gathers with 16 lanes of 32-bit indices.
pub struct ColumnTaps {
    x0: Vec<u32>,
    x1: Vec<u32>,
    w0: Vec<f32>,
    w1: Vec<f32>,
}

impl ColumnTaps {
    pub fn new(xs: &[BilinearTap]) -> Self {
        Self {
            x0: xs.iter().map(|t| t.0 as u32).collect(),
            x1: xs.iter().map(|t| t.1 as u32).collect(),
            w0: xs.iter().map(|t| t.2).collect(),
            w1: xs.iter().map(|t| t.3).collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.x0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.x0.is_empty()
    }
}

impl<'a> BilinearRows<'a> {
    /// `plane` is `h` x `w`; `xs` the output columns' taps.
    pub fn new(plane: &'a [f32], w: usize, xs: &'a ColumnTaps) -> Self {
        Self { plane, w, xs, held: [None, None], rows: [vec![0.0; xs.len()], vec![0.0; xs.len()]] }
    }

    /// The slot holding source row `y`, filling one that does not hold `keep`.
    fn slot(&mut self, y: usize, keep: Option<usize>) -> usize {
        if let Some(s) = self.held.iter().position(|&h| h == Some(y)) {
            return s;
        }
        let s = usize::from(keep.is_some() && self.held[0] == keep);
        let src = &self.plane[y * self.w..(y + 1) * self.w];
        let t = self.xs;
        lerp_taps(crate::simd::isa::current(), src, &t.x0, &t.x1, &t.w0, &t.w1, &mut self.rows[s]);
        self.held[s] = Some(y);
        s
    }

    /// Output row with vertical tap `ty` into `out` (length `ow`).
    pub fn row(&mut self, (y0, y1, wy0, wy1): BilinearTap, out: &mut [f32]) {
        let s0 = self.slot(y0, Some(y1));
        let s1 = self.slot(y1, Some(y0));
        let (t0, t1) = (&self.rows[s0], &self.rows[s1]);
        for ((o, &a), &b) in out.iter_mut().zip(t0).zip(t1) {
            *o = a * wy0 + b * wy1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "aarch64")]
mod neon;

/// Whether `level` takes the `neon` routes here (every Arm level but `portable`, never above
/// what the CPU has: `usable`).
#[cfg(target_arch = "aarch64")]
fn neon_route(level: crate::simd::isa::Isa) -> bool {
    use crate::simd::isa::{usable, Isa};
    matches!(usable(level), Isa::Neon | Isa::Dotprod | Isa::I8mm | Isa::Bf16)
}

/// The portable loop's arithmetic over `range`: the blocks the vector routes' permutes cannot
/// take, and their tails.
#[cold]
#[inline(never)]
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
fn lerp_scalar(src: &[f32], x0: &[u32], x1: &[u32], w0: &[f32], w1: &[f32], out: &mut [f32], range: std::ops::Range<usize>) {
    let last = src.len() - 1;
    for i in range {
        let (a, b) = ((x0[i] as usize).min(last), (x1[i] as usize).min(last));
        out[i] = src[a] * w0[i] + src[b] * w1[i];
    }
}

/// Whether `level` takes the `avx2` routes here (AVX2 and AVX-512 levels, never above what
/// the CPU has: `usable`).
#[cfg(target_arch = "x86_64")]
fn avx2_route(level: crate::simd::isa::Isa) -> bool {
    use crate::simd::isa::{usable, Isa};
    matches!(crate::simd::route(usable(level)), Isa::Avx2 | Isa::Avx512)
}

/// out[i] = src[x0[i]]·w0[i] + src[x1[i]]·w1[i] (the post-processing runs it once per source
/// row of each map): on AVX2 and above by in-register permutes where a block of columns allows
/// (`avx2`), on NEON by table lookups (`neon`), else the portable loop compiled for the widest vectors the CPU has (gathers). The
/// same arithmetic on every route, so every level gives the same bits.
fn lerp_taps(level: crate::simd::isa::Isa, src: &[f32], x0: &[u32], x1: &[u32], w0: &[f32], w1: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2_route(level) {
        // SAFETY: `avx2_route` holds only where the CPU has AVX2 and FMA.
        return unsafe { avx2::lerp_taps(src, x0, x1, w0, w1, out) };
    }
    #[cfg(target_arch = "aarch64")]
    if neon_route(level) {
        // SAFETY: NEON is every aarch64 CPU's.
        return unsafe { neon::lerp_taps(src, x0, x1, w0, w1, out) };
    }
    lerp_taps_gather(level, src, x0, x1, w0, w1, out)
}

crate::simd::dispatch! {
    /// [`lerp_taps`] as one loop that vectorises with gathers.
    fn lerp_taps_gather / lerp_taps_baseline(src: &[f32], x0: &[u32], x1: &[u32], w0: &[f32], w1: &[f32], out: &mut [f32]) {
        // The clamp never changes a tap of `bilinear_axis(src.len(), _)`; it keeps every read
        // inside the row without a bounds check (which would keep the loop scalar).
        let Some(last) = src.len().checked_sub(1) else { return };
        let last = u32::try_from(last).expect("a row of fewer than 2^32 pixels");
        for ((((o, &a), &b), &wa), &wb) in out.iter_mut().zip(x0).zip(x1).zip(w0).zip(w1) {
            // SAFETY: both indices are at most `last`, which is `src.len() - 1`.
            let (va, vb) = unsafe { (*src.get_unchecked(a.min(last) as usize), *src.get_unchecked(b.min(last) as usize)) };
            *o = va * wa + vb * wb;
        }
    }
}

/// Antialiased bilinear (triangle filter) weights for one axis, as PyTorch's
/// `_compute_indices_weights_aa` with interp_size 2.
fn antialias_axis(input: usize, output: usize) -> Vec<Taps> {
    let scale = input as f32 / output as f32;
    let support = if scale >= 1.0 { scale } else { 1.0 };
    let invscale = if scale >= 1.0 { 1.0 / scale } else { 1.0 };
    (0..output)
        .map(|i| {
            let center = scale * (i as f32 + 0.5);
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(input as i64) as usize;
            let size = xmax.saturating_sub(xmin);
            let mut weights: Vec<f32> = (0..size)
                .map(|j| {
                    let t = (j as f32 + xmin as f32 - center + 0.5) * invscale;
                    (1.0 - t.abs()).max(0.0)
                })
                .collect();
            let total: f32 = weights.iter().sum();
            if total != 0.0 {
                for wv in &mut weights {
                    *wv /= total;
                }
            }
            Taps { start: xmin, weights }
        })
        .collect()
}

/// `F.interpolate(mode='bilinear', align_corners=False, antialias=True)`: horizontal pass
/// first into a float32 intermediate, then vertical, as the CPU kernel does.
pub fn resize_bilinear_antialias(src: &[f32], c: usize, h: usize, w: usize, oh: usize, ow: usize) -> Vec<f32> {
    assert_eq!(src.len(), c * h * w);
    let xs = antialias_axis(w, ow);
    let mut tmp = vec![0f32; c * h * ow];
    for (srow, trow) in src.chunks_exact(w).zip(tmp.chunks_exact_mut(ow)) {
        for (t, tap) in trow.iter_mut().zip(&xs) {
            let mut acc = 0f32;
            for (k, wv) in tap.weights.iter().enumerate() {
                acc += srow[tap.start + k] * wv;
            }
            *t = acc;
        }
    }
    vertical_antialias(crate::simd::isa::current(), &tmp, c, h, ow, oh)
}

/// [`resize_bilinear_antialias`] of an interleaved 8-bit RGB image whose float values are
/// v / 255 (numpy's `image / 255` in float64 cast to float32 gives the same value: a float64
/// quotient rounded to float32 is the correctly rounded float32 quotient), to planar (3, oh,
/// ow), bit for bit the same. Streamed eight source rows at a time: each is split into three
/// float rows, the eight rows of a channel are turned into columns of eight lanes (one per row)
/// so that the x pass is a vector product per tap with no gather ([`taps_along_x8`]), the result
/// is turned back into rows in a ring of the last few filtered rows, and each output row is made
/// as soon as its rows are in the ring. The full-size float copy of the photo (24 MB at 1080p)
/// and the x-filtered image (10 MB) are never made.
pub fn resize_rgb8_antialias(rgb: &[u8], h: usize, w: usize, oh: usize, ow: usize) -> Vec<f32> {
    assert_eq!(rgb.len(), 3 * h * w);
    let level = crate::simd::isa::current();
    let (xs, ys) = (antialias_axis(w, ow), antialias_axis(h, oh));
    // The taps as a table of `width` weights per output column, zero past each column's own
    // (a zero weight adds +0.0 to a sum of non-negative terms: no change to it).
    let width = xs.iter().map(|t| t.weights.len()).max().unwrap_or(0);
    let starts: Vec<u32> = xs.iter().map(|t| t.start as u32).collect();
    let mut weights = vec![0f32; width * ow];
    for (i, t) in xs.iter().enumerate() {
        for (k, &wv) in t.weights.iter().enumerate() {
            weights[k * ow + i] = wv;
        }
    }
    // Row y of channel c at ring[(y % slots * 3 + c) * ow..]. The taps' first and last rows
    // never decrease from one output row to the next, and rows are filtered up to seven past
    // the last one an output row reads, so `taps + 7` rows before the next one to filter hold
    // every row the current output row reads.
    let slots = ys.iter().map(|t| t.weights.len()).max().unwrap_or(0).max(1) + LANES - 1;
    let mut ring = vec![0f32; 3 * slots * ow];
    let mut planes = vec![0f32; LANES * 3 * w];
    let mut lanes = vec![0f32; LANES * w];
    let mut filtered = vec![0f32; LANES * ow];
    let mut out = vec![0f32; 3 * oh * ow];
    let mut next = 0;
    for (oy, tap) in ys.iter().enumerate() {
        while next < tap.start + tap.weights.len() {
            // The last group of a photo repeats its last row in the lanes past it (not kept).
            let rows = LANES.min(h - next);
            for (r, dst) in planes.chunks_exact_mut(3 * w).enumerate() {
                rgb8_planes(level, &rgb[(next + r.min(rows - 1)) * 3 * w..][..3 * w], dst);
            }
            for c in 0..3 {
                rows_to_lanes(level, &planes, c, w, &mut lanes);
                taps_along_x8(level, &lanes, &starts, &weights, &mut filtered);
                let at: [usize; LANES] = std::array::from_fn(|r| ((next + r) % slots * 3 + c) * ow);
                lanes_to_rows(level, &filtered, &mut ring, ow, &at[..rows]);
            }
            next += rows;
        }
        for c in 0..3 {
            let row = &mut out[(c * oh + oy) * ow..][..ow];
            for (k, &wv) in tap.weights.iter().enumerate() {
                let src = &ring[((tap.start + k) % slots * 3 + c) * ow..][..ow];
                weighted_row(level, src, wv, k == 0, row);
            }
        }
    }
    out
}

/// Source rows filtered along x together, one per vector lane.
const LANES: usize = 8;

/// Channel `c` of `LANES` rows of planes (`[row][channel][x]`, rows of `w`) as `[x][row]`.
fn rows_to_lanes(level: crate::simd::isa::Isa, planes: &[f32], c: usize, w: usize, lanes: &mut [f32]) {
    let row = |r: usize| &planes[(r * 3 + c) * w..][..w];
    let rows: [&[f32]; LANES] = std::array::from_fn(row);
    // The columns a vector route did in whole blocks; this loop does the rest.
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if avx2_route(level) {
        // SAFETY: `avx2_route` holds only where the CPU has AVX2 and FMA.
        done = unsafe { avx2::rows_to_lanes(&rows, lanes) };
    }
    #[cfg(target_arch = "aarch64")]
    if neon_route(level) {
        // SAFETY: NEON is every aarch64 CPU's.
        done = unsafe { neon::rows_to_lanes(&rows, lanes) };
    }
    let _ = level;
    for (x, l) in lanes.chunks_exact_mut(LANES).enumerate().take(w).skip(done) {
        for (v, r) in l.iter_mut().zip(&rows) {
            *v = r[x];
        }
    }
}

/// `[i][row]` lanes back into rows of `ow`: `ring[at[r] + i] = lanes[i * LANES + r]` for the
/// rows given (distinct rows of the ring).
fn lanes_to_rows(level: crate::simd::isa::Isa, lanes: &[f32], ring: &mut [f32], ow: usize, at: &[usize]) {
    assert!(lanes.len() >= ow * LANES && at.len() <= LANES && at.iter().all(|&a| a + ow <= ring.len()));
    // The values a vector route did in whole blocks; this loop does the rest.
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if at.len() == LANES && avx2_route(level) {
        // SAFETY: `avx2_route` holds only where the CPU has AVX2 and FMA; every
        // row `at[r]..at[r] + ow` is inside the ring (asserted above).
        done = unsafe { avx2::lanes_to_rows(lanes, ring, ow, at) };
    }
    #[cfg(target_arch = "aarch64")]
    if at.len() == LANES && neon_route(level) {
        // SAFETY: NEON is every aarch64 CPU's; every row `at[r]..at[r] + ow` is inside the
        // ring (asserted above).
        done = unsafe { neon::lanes_to_rows(lanes, ring, ow, at) };
    }
    let _ = level;
    for (r, &a) in at.iter().enumerate() {
        for (o, l) in ring[a + done..a + ow].iter_mut().zip(lanes.chunks_exact(LANES).skip(done)) {
            *o = l[r];
        }
    }
}

crate::simd::dispatch! {
    /// One row of 8-bit RGB as three planar float rows of v / 255.
    fn rgb8_planes / rgb8_planes_baseline(src: &[u8], planes: &mut [f32]) {
        let w = src.len() / 3;
        let (p0, rest) = planes.split_at_mut(w);
        let (p1, p2) = rest.split_at_mut(w);
        for (((px, a), b), c) in src.chunks_exact(3).zip(p0).zip(p1).zip(p2) {
            (*a, *b, *c) = (px[0] as f32 / 255.0, px[1] as f32 / 255.0, px[2] as f32 / 255.0);
        }
    }
}

crate::simd::dispatch! {
    /// out[i][r] = Σ_k src[starts[i] + k][r] · weights[k][i] for the `LANES` rows r side by
    /// side, summed in k order from 0 (the order of PyTorch's kernel): a product per tap of
    /// whole vectors, where filtering one row at a time needs a gather per tap.
    fn taps_along_x8 / taps_along_x8_baseline(src: &[f32], starts: &[u32], weights: &[f32], out: &mut [f32]) {
        let (src, _) = src.as_chunks::<LANES>();
        let (out, _) = out.as_chunks_mut::<LANES>();
        let Some(last) = src.len().checked_sub(1) else {
            out.iter_mut().for_each(|o| *o = [0.0; LANES]);
            return;
        };
        let ow = out.len();
        let width = weights.len().checked_div(ow).unwrap_or(0);
        for (i, (o, &s)) in out.iter_mut().zip(starts).enumerate() {
            // The clamp only moves padded taps (zero weight) back into the row.
            let tap = |k: usize| &src[(s as usize + k).min(last)];
            // The first tap is stored, not added to zeros: 0 + t is t for the non-negative
            // products here (pixels / 255 times triangle weights).
            let (t, wv) = (tap(0), weights[i]);
            let mut acc: [f32; LANES] = std::array::from_fn(|r| t[r] * wv);
            for k in 1..width {
                let (t, wv) = (tap(k), weights[k * ow + i]);
                for (a, v) in acc.iter_mut().zip(t) {
                    *a += v * wv;
                }
            }
            *o = acc;
        }
    }
}

crate::simd::dispatch! {
    /// row = src · wv (the first tap) or row += src · wv: one tap of the vertical pass.
    fn weighted_row / weighted_row_baseline(src: &[f32], wv: f32, first: bool, row: &mut [f32]) {
        if first {
            row.iter_mut().zip(src).for_each(|(o, s)| *o = s * wv);
        } else {
            row.iter_mut().zip(src).for_each(|(o, s)| *o += s * wv);
        }
    }
}

crate::simd::dispatch! {
    /// The vertical pass of the antialiased resize over `c` planes of `h` x `ow`.
    fn vertical_antialias / vertical_antialias_baseline(tmp: &[f32], c: usize, h: usize, ow: usize, oh: usize) -> Vec<f32> {
        let ys = antialias_axis(h, oh);
        let mut out = vec![0f32; c * oh * ow];
        for ch in 0..c {
            let plane = &tmp[ch * h * ow..(ch + 1) * h * ow];
            let dst = &mut out[ch * oh * ow..(ch + 1) * oh * ow];
            for (oy, tap) in ys.iter().enumerate() {
                let row = &mut dst[oy * ow..(oy + 1) * ow];
                for (k, wv) in tap.weights.iter().enumerate() {
                    let srow = &plane[(tap.start + k) * ow..(tap.start + k + 1) * ow];
                    if k == 0 {
                        for (o, s) in row.iter_mut().zip(srow) {
                            *o = s * wv;
                        }
                    } else {
                        for (o, s) in row.iter_mut().zip(srow) {
                            *o += s * wv;
                        }
                    }
                }
            }
        }
        out
    }
}

/// PyTorch legacy `mode='nearest'` source index for one axis.
pub fn nearest_axis(input: usize, output: usize) -> Vec<usize> {
    if output == input {
        return (0..output).collect();
    }
    if output == 2 * input {
        return (0..output).map(|d| d >> 1).collect();
    }
    let scale = input as f32 / output as f32;
    (0..output).map(|d| ((d as f32 * scale).floor() as usize).min(input - 1)).collect()
}

/// Bicubic (A = -0.75) weights of PyTorch's `upsample_bicubic2d`, align_corners=False, with
/// the coordinate scale given (DINOv2 passes a scale factor, so the scale is 1/factor).
/// FMA as the compiled kernel contracts it.
fn bicubic_axis(input: usize, output: usize, coord_scale: f32) -> Vec<([usize; 4], [f32; 4])> {
    const A: f32 = -0.75;
    let c1 = |x: f32| ((A + 2.0).mul_add(x, -(A + 3.0)) * x).mul_add(x, 1.0);
    let c2 = |x: f32| (A.mul_add(x, -5.0 * A).mul_add(x, 8.0 * A)).mul_add(x, -4.0 * A);
    (0..output)
        .map(|dst| {
            let src = coord_scale.mul_add(dst as f32 + 0.5, -0.5);
            let fl = src.floor();
            let t = src - fl;
            let i0 = fl as i64;
            let idx = [i0 - 1, i0, i0 + 1, i0 + 2].map(|i| i.clamp(0, input as i64 - 1) as usize);
            (idx, [c2(t + 1.0), c1(t), c1(1.0 - t), c2(2.0 - t)])
        })
        .collect()
}

/// `F.interpolate(mode='bicubic', align_corners=False, scale_factor=(sy, sx))` of planar data.
// The shape arguments of the other resizes (c, h, w, oh, ow), and the two scale factors.
#[allow(clippy::too_many_arguments)]
pub fn resize_bicubic_scaled(src: &[f32], c: usize, h: usize, w: usize, oh: usize, ow: usize, sy: f64, sx: f64) -> Vec<f32> {
    let ys = bicubic_axis(h, oh, (1.0 / sy) as f32);
    let xs = bicubic_axis(w, ow, (1.0 / sx) as f32);
    let mut out = vec![0f32; c * oh * ow];
    for ch in 0..c {
        let plane = &src[ch * h * w..(ch + 1) * h * w];
        for (oy, (yi, yw)) in ys.iter().enumerate() {
            for (ox, (xi, xw)) in xs.iter().enumerate() {
                let mut rows = [0f32; 4];
                for k in 0..4 {
                    let r = &plane[yi[k] * w..(yi[k] + 1) * w];
                    rows[k] = r[xi[0]] * xw[0] + r[xi[1]] * xw[1] + r[xi[2]] * xw[2] + r[xi[3]] * xw[3];
                }
                out[ch * oh * ow + oy * ow + ox] = rows[0] * yw[0] + rows[1] * yw[1] + rows[2] * yw[2] + rows[3] * yw[3];
            }
        }
    }
    out
}

#[cfg(test)]
mod rows_tests {
    use super::*;
    use crate::simd::isa;

    /// `resize_rgb8_antialias` divides in float32 where numpy divides in float64 and casts: the
    /// same value for every byte.
    #[test]
    fn float32_division_by_255_is_numpys() {
        for v in 0..=255u8 {
            assert_eq!((v as f32 / 255.0).to_bits(), ((v as f64 / 255.0) as f32).to_bits(), "{v}");
        }
    }

    /// Row by row, at every ISA level this machine has, the bits of the whole-map resize (the
    /// post-processing's upsample of the head outputs; up and down, odd sizes, one column).
    #[test]
    fn lerp_taps_is_the_portable_loop_for_any_taps() {
        let mut rng = crate::test_rng::Rng::new(0x2545_f491_4f6c_dd1d);
        let mut next = |m: u32| rng.below(m as usize) as u32;
        let src: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let n = 203;
        // Runs where eight columns fit eight floats (the permute route), blocks that do not
        // (spread, decreasing, past the row's end, which the clamp takes back), and the tail.
        let x0: Vec<u32> = (0..n)
            .map(|i| match i / 40 {
                0 => i as u32 / 3,
                1 => 99 - (i as u32 % 40),
                2 => next(100),
                3 => 95 + next(10),
                _ => i as u32 % 7,
            })
            .collect();
        let x1: Vec<u32> = x0.iter().map(|&a| if next(5) == 0 { a } else { a + 1 }).collect();
        let w0: Vec<f32> = (0..n).map(|_| next(1000) as f32 / 999.0).collect();
        let w1: Vec<f32> = w0.iter().map(|w| 1.0 - w).collect();
        let mut want = vec![0f32; n];
        lerp_taps_baseline(&src, &x0, &x1, &w0, &w1, &mut want);
        for level in isa::levels() {
            let mut got = vec![f32::NAN; n];
            lerp_taps(level, &src, &x0, &x1, &w0, &w1, &mut got);
            assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{level}");
        }
    }

    /// The antialiased downscale's transposes (rows to lanes and back) move every value to the
    /// portable loops' place at every level, at widths around the vector widths (4 and 8), and
    /// leave what lies past them untouched.
    #[test]
    fn lane_transposes_match_the_portable_loops_at_every_level() {
        for w in [1, 3, 4, 5, 8, 9, 13, 16, 37] {
            let planes: Vec<f32> = (0..LANES * 3 * w).map(|i| i as f32 * 0.5 - 7.0).collect();
            let run = |level: isa::Isa| {
                let mut lanes = vec![f32::NAN; LANES * w + 5];
                rows_to_lanes(level, &planes, 1, w, &mut lanes[..LANES * w]);
                // Back into a ring of rows at scattered starts, a sentinel between them.
                let at: Vec<usize> = (0..LANES).map(|r| (LANES - 1 - r) * (w + 3) + 1).collect();
                let mut ring = vec![-1f32; LANES * (w + 3) + 2];
                lanes_to_rows(level, &lanes, &mut ring, w, &at);
                (lanes.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), ring)
            };
            let (lanes, ring) = run(isa::Isa::Portable);
            for x in 0..w {
                for r in 0..LANES {
                    assert_eq!(f32::from_bits(lanes[x * LANES + r]), planes[(r * 3 + 1) * w + x], "w {w}: lane {r} of column {x}");
                }
            }
            assert!(lanes[LANES * w..].iter().all(|&v| f32::from_bits(v).is_nan()), "w {w}: written past the lanes");
            // Each row back where it was sent, and -1 between the rows.
            let mut want = vec![-1f32; ring.len()];
            for r in 0..LANES {
                want[(LANES - 1 - r) * (w + 3) + 1..][..w].copy_from_slice(&planes[(r * 3 + 1) * w..][..w]);
            }
            assert_eq!(ring, want, "w {w}: the rows from the lanes");
            for level in isa::levels() {
                assert_eq!(run(level), (lanes.clone(), ring.clone()), "{level}: w {w}");
            }
        }
    }

    #[test]
    fn bilinear_rows_give_resize_bilinear_bits_at_every_level() {
        let mut rng = crate::test_rng::Rng::new(0x853c_49e6_748f_ea9b);
        for (h, w, oh, ow) in [(30, 56, 1080, 1920), (7, 5, 13, 33), (9, 1, 4, 3), (40, 40, 17, 23)] {
            let plane: Vec<f32> = (0..h * w).map(|_| rng.unit() * 4.0).collect();
            let want = resize_bilinear(&plane, 1, h, w, oh, ow);
            let (xs, ys) = (bilinear_axis(w, ow), bilinear_axis(h, oh));
            let xs = ColumnTaps::new(&xs);
            for level in isa::levels() {
                isa::with_isa(level, || {
                    let mut rows = BilinearRows::new(&plane, w, &xs);
                    let mut out = vec![0f32; ow];
                    for (y, &ty) in ys.iter().enumerate() {
                        rows.row(ty, &mut out);
                        assert!(out == want[y * ow..(y + 1) * ow], "{level}: {h}x{w} -> {oh}x{ow}, row {y}");
                    }
                });
            }
        }
    }
}
