//! PyTorch CPU interpolation, reproduced in float32 the way PyTorch computes it (coordinates
//! and weights in float32; a float64 version differs by up to 1e-4, see the spec §4).
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
    xs: &'a [BilinearTap],
    /// Source row index held by each slot, and its x-interpolated values.
    held: [Option<usize>; 2],
    rows: [Vec<f32>; 2],
}

impl<'a> BilinearRows<'a> {
    /// `plane` is `h` x `w`; `xs` the output columns' taps (`bilinear_axis(w, ow)`).
    pub fn new(plane: &'a [f32], w: usize, xs: &'a [BilinearTap]) -> Self {
        Self { plane, w, xs, held: [None, None], rows: [vec![0.0; xs.len()], vec![0.0; xs.len()]] }
    }

    /// The slot holding source row `y`, filling one that does not hold `keep`.
    fn slot(&mut self, y: usize, keep: Option<usize>) -> usize {
        if let Some(s) = self.held.iter().position(|&h| h == Some(y)) {
            return s;
        }
        let s = usize::from(keep.is_some() && self.held[0] == keep);
        let src = &self.plane[y * self.w..(y + 1) * self.w];
        lerp_taps(crate::model::cpu::isa::current(), src, self.xs, &mut self.rows[s]);
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

crate::model::cpu::math::dispatch! {
    /// out[i] = src[x0]·wx0 + src[x1]·wx1 over the taps, compiled for the widest vectors the CPU
    /// has (gathers; the post-processing runs it once per source row of each map). The same
    /// arithmetic in every build, so every level gives the same bits.
    fn lerp_taps / lerp_taps_baseline(src: &[f32], xs: &[BilinearTap], out: &mut [f32]) {
        // The clamp never changes a tap of `bilinear_axis(src.len(), _)`; it lets the compiler
        // drop the bounds checks, which would keep the loop scalar.
        let Some(last) = src.len().checked_sub(1) else { return };
        for (o, &(x0, x1, wx0, wx1)) in out.iter_mut().zip(xs) {
            *o = src[x0.min(last)] * wx0 + src[x1.min(last)] * wx1;
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
    vertical_antialias(&tmp, c, h, ow, oh)
}

/// [`resize_bilinear_antialias`] of an interleaved 8-bit RGB image whose float values are
/// `lut[byte]`, to planar (3, oh, ow), bit for bit the same: the horizontal pass reads the bytes,
/// so the full-size float copy of the photo is never made (24 MB at 1080p), and the three
/// channels' sums run side by side.
pub fn resize_rgb8_antialias(rgb: &[u8], h: usize, w: usize, oh: usize, ow: usize, lut: &[f32; 256]) -> Vec<f32> {
    assert_eq!(rgb.len(), 3 * h * w);
    let xs = antialias_axis(w, ow);
    let mut tmp = vec![0f32; 3 * h * ow];
    let (t0, rest) = tmp.split_at_mut(h * ow);
    let (t1, t2) = rest.split_at_mut(h * ow);
    for (y, src) in rgb.chunks_exact(3 * w).enumerate() {
        let out = y * ow..(y + 1) * ow;
        for (((o0, o1), o2), tap) in t0[out.clone()].iter_mut().zip(&mut t1[out.clone()]).zip(&mut t2[out]).zip(&xs) {
            let (mut a0, mut a1, mut a2) = (0f32, 0f32, 0f32);
            for (px, wv) in src[3 * tap.start..].chunks_exact(3).zip(&tap.weights) {
                a0 += lut[px[0] as usize] * wv;
                a1 += lut[px[1] as usize] * wv;
                a2 += lut[px[2] as usize] * wv;
            }
            (*o0, *o1, *o2) = (a0, a1, a2);
        }
    }
    vertical_antialias(&tmp, 3, h, ow, oh)
}

/// The vertical pass of the antialiased resize over `c` planes of `h` x `ow`.
fn vertical_antialias(tmp: &[f32], c: usize, h: usize, ow: usize, oh: usize) -> Vec<f32> {
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
    use crate::model::cpu::isa;

    /// Row by row, at every ISA level this machine has, the bits of the whole-map resize (the
    /// post-processing's upsample of the head outputs; up and down, odd sizes, one column).
    #[test]
    fn bilinear_rows_give_resize_bilinear_bits_at_every_level() {
        let mut seed = 0x853c_49e6_748f_ea9bu64;
        for (h, w, oh, ow) in [(30, 56, 1080, 1920), (7, 5, 13, 33), (9, 1, 4, 3), (40, 40, 17, 23)] {
            let plane: Vec<f32> = (0..h * w)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
                })
                .collect();
            let want = resize_bilinear(&plane, 1, h, w, oh, ow);
            let (xs, ys) = (bilinear_axis(w, ow), bilinear_axis(h, oh));
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
