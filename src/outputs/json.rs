//! The sidecar `x.json`: what a script needs to use the maps without opening the npz (size,
//! field of view, intrinsics, metric scale, depth statistics, the depth PNG scale) and where
//! they came from (model, weights digest, tool version, options, timings).

use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use super::write_atomic;
use crate::infer::Prediction;

#[derive(Debug, Clone, Serialize)]
pub struct Sidecar {
    pub input: String,
    /// The frame of the video `input`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame: Option<FrameInfo>,
    pub width: usize,
    pub height: usize,
    /// Degrees.
    pub fov_x: f32,
    pub fov_y: f32,
    /// Normalised: the image spans [0, 1] x [0, 1].
    pub intrinsics: [[f32; 3]; 3],
    pub intrinsics_pixels: [[f32; 3]; 3],
    pub metric_scale: f32,
    pub depth: DepthStats,
    pub depth_png: DepthPng,
    pub has_normal: bool,
    pub model: ModelInfo,
    pub tool: ToolInfo,
    pub inference: InferenceInfo,
    pub timings_ms: Timings,
    /// What a run's own work added (`moge colmap`'s `colmap`).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// Which frame of a video a sidecar is of.
#[derive(Debug, Clone, Serialize)]
pub struct FrameInfo {
    /// Its number in the video, from 0 (every decoded frame counted).
    pub index: u64,
    /// Its presentation time, seconds.
    pub time_s: Option<f64>,
    /// The frame's own metric scale, where `--video-scale smooth` replaced it (`metric_scale`
    /// is then the smoothed one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric_scale_raw: Option<f32>,
    /// The frame's own field of view, where `--video-fov smooth` replaced it (`fov_x` is then
    /// the smoothed one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fov_x_raw: Option<f32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DepthStats {
    pub valid_pixels: usize,
    pub valid_fraction: f64,
    /// Metres over the valid pixels; null when none is valid.
    pub min: Option<f32>,
    pub max: Option<f32>,
    pub mean: Option<f64>,
    pub median: Option<f32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DepthPng {
    /// Metres per unit of `x.depth.png` (0 = invalid).
    pub scale: f32,
    /// Valid pixels whose depth does not fit the 16-bit range at this scale (clamped); counted
    /// by `write_all` as it writes (or would write) the depth PNG.
    pub saturated: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    /// The published name (`vitl-normal`) or the checkpoint's file name.
    pub id: String,
    pub weights_sha256: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ToolInfo {
    pub name: &'static str,
    pub version: &'static str,
}

impl Default for ToolInfo {
    fn default() -> Self {
        Self { name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION") }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct InferenceInfo {
    /// Where the network ran: `cpu` or `cuda:N`.
    pub device: String,
    pub num_tokens: u32,
    /// ViT token grid (rows, cols).
    pub grid: (usize, usize),
    /// exact, pad or stretch.
    pub fit: String,
    /// The canvas of pad / stretch (width, height).
    pub canvas: Option<(u32, u32)>,
    pub exif_orientation: bool,
    /// The horizontal field of view given with --fov-x, or read from the photo's EXIF (degrees).
    pub fov_x_given: Option<f32>,
    /// Where the field of view came from: `given`, `exif: <the tags>`, or `estimated` by the model.
    pub fov_x_source: String,
    /// With `--server`: its URL, model and device, and its own timings of this image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Timings {
    pub decode: f64,
    pub prepare: f64,
    pub forward: f64,
    pub postprocess: f64,
    /// Writing the other outputs of the image (set just before the sidecar is written).
    pub write: Option<f64>,
}

impl DepthStats {
    /// Over the valid, finite depths. One pass gathers the count, min, max, the sum (the bits
    /// of the depths' sum in pixel order, in f64) and a histogram of each value's 16 high order
    /// bits; the median (the element of rank n/2 in `total_cmp` order) is then picked among the
    /// few values of its bin, not by selecting over a copy of every depth.
    pub fn of(p: &Prediction) -> Self {
        let len = p.depth.len().min(p.mask.len());
        let (depth, mask) = (&p.depth[..len], &p.mask[..len]);
        let level = crate::simd::isa::current();
        let mut hists = vec![0u32; 4 << 16];
        let Lanes { n, sums, mins, maxs } = depth_lanes(level, depth, mask, &mut hists);
        let min = mins.into_iter().fold(f32::INFINITY, |a, b| if b < a { b } else { a });
        let max = maxs.into_iter().fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a });
        let sum = if sums_are_exact(n, min, max) {
            sums.into_iter().fold(-0.0, |a, b| a + b)
        } else {
            depth.iter().zip(mask).filter(|&(&v, &m)| m && v.is_finite()).map(|(&v, _)| v as f64).sum()
        };
        let (first, rest) = hists.split_at_mut(1 << 16);
        for h in rest.chunks_exact(1 << 16) {
            first.iter_mut().zip(h).for_each(|(a, &b)| *a += b);
        }
        let hist = first;
        hist[DUMP_BIN as usize] = 0;
        let valid_fraction = if p.mask.is_empty() { 0.0 } else { n as f64 / p.mask.len() as f64 };
        if n == 0 {
            return Self { valid_pixels: 0, valid_fraction, min: None, max: None, mean: None, median: None };
        }
        let rank = n / 2;
        let (mut below, mut bin) = (0usize, 0usize);
        for (i, &c) in hist.iter().enumerate() {
            if below + c as usize > rank {
                bin = i;
                break;
            }
            below += c as usize;
        }
        let mut in_bin = bin_values(level, depth, mask, bin as u32);
        let (_, med, _) = in_bin.select_nth_unstable_by(rank - below, f32::total_cmp);
        Self { valid_pixels: n, valid_fraction, min: Some(min), max: Some(max), mean: Some(sum / n as f64), median: Some(*med) }
    }
}

/// Pixels per lane step of [`depth_lanes`]: pixel i is in lane i % LANES.
const LANES: usize = 8;

/// The histogram bin of every pixel that is not a valid, finite depth: +infinity's, which no
/// finite value shares (finite values' keys stop at bin 0xff7f), emptied after counting.
const DUMP_BIN: u32 = 0xff80;

/// What [`depth_lanes`] gathers per lane, the count in all.
struct Lanes {
    n: usize,
    sums: [f64; LANES],
    mins: [f32; LANES],
    maxs: [f32; LANES],
}

crate::simd::dispatch! {
    /// The count of valid, finite depths and, per lane (pixel i goes to lane i % 8), their sum,
    /// minimum and maximum, and a histogram of their 16 high order bits (`hists`: 4 x 2^16,
    /// pixel i counted in table i % 4 or, in a run of 16 in one bin, the run's table; the others
    /// in [`DUMP_BIN`]). By blocks of 64 pixels: the count, sums, extremes and bins in one
    /// branch-free pass (selects, not tests, so that it vectorises: a test per pixel ran ~8
    /// cycles a pixel), then the bins counted. Neighbouring pixels mostly share a bin, and with
    /// one table each count would wait for the last one's store.
    fn depth_lanes / depth_lanes_baseline(depth: &[f32], mask: &[bool], hists: &mut [u32]) -> Lanes {
        const BLOCK: usize = 64;
        assert!(hists.len() >= 4 << 16, "four tables of 2^16 bins");
        let mut counts = [0u32; LANES];
        let mut n = 0usize;
        // -0.0: the neutral element `Iterator::sum` starts from, and what an invalid pixel adds.
        let mut sums = [-0f64; LANES];
        let (mut mins, mut maxs) = ([f32::INFINITY; LANES], [f32::NEG_INFINITY; LANES]);
        let mut bins = [0u32; BLOCK];
        for (d, m) in depth.chunks(BLOCK).zip(mask.chunks(BLOCK)) {
            let bins = &mut bins[..d.len()];
            let step = |lane: usize, v: f32, m: bool, counts: &mut [u32; LANES], sums: &mut [f64; LANES], mins: &mut [f32; LANES], maxs: &mut [f32; LANES]| -> u32 {
                let ok = m & v.is_finite();
                counts[lane] += ok as u32;
                sums[lane] += if ok { v as f64 } else { -0.0 };
                mins[lane] = if ok & (v < mins[lane]) { v } else { mins[lane] };
                maxs[lane] = if ok & (v > maxs[lane]) { v } else { maxs[lane] };
                if ok { order_key(v) >> 16 } else { DUMP_BIN }
            };
            let (d8, m8, b8) = (d.chunks_exact(LANES), m.chunks_exact(LANES), bins.chunks_exact_mut(LANES));
            let (dr, mr) = (d8.remainder(), m8.remainder());
            for ((d, m), b) in d8.zip(m8).zip(b8) {
                // One operation over the eight lanes at a time (the same sums as `step`):
                // lane by lane, each a chain of scalar selects, it did not vectorise.
                let mut ok = [0u32; LANES];
                for l in 0..LANES {
                    ok[l] = (m[l] & d[l].is_finite()) as u32;
                }
                for l in 0..LANES {
                    counts[l] += ok[l];
                }
                for l in 0..LANES {
                    sums[l] += if ok[l] != 0 { d[l] as f64 } else { -0.0 };
                }
                for l in 0..LANES {
                    mins[l] = if (ok[l] != 0) & (d[l] < mins[l]) { d[l] } else { mins[l] };
                    maxs[l] = if (ok[l] != 0) & (d[l] > maxs[l]) { d[l] } else { maxs[l] };
                }
                for l in 0..LANES {
                    let keep = ok[l].wrapping_neg();
                    b[l] = (order_key(d[l]) >> 16) & keep | DUMP_BIN & !keep;
                }
            }
            // A last block's last pixels: lanes 0.. again, since every block starts at a
            // multiple of 8.
            let tail = bins.len() - dr.len();
            for (lane, (&v, &m)) in dr.iter().zip(mr).enumerate() {
                bins[tail + lane] = step(lane, v, m, &mut counts, &mut sums, &mut mins, &mut maxs);
            }
            // A run of 16 pixels in one bin (most of a smooth depth map, whose bins are 1/128
            // of an octave wide) is one count of 16; the others one count each.
            for (j, run) in bins.chunks(16).enumerate() {
                let first = run[0];
                if run.len() == 16 && run.iter().fold(true, |same, &b| same & (b == first)) {
                    hists[((j & 3) << 16) | (first & 0xffff) as usize] += 16;
                } else {
                    for (i, &b) in run.iter().enumerate() {
                        hists[((i & 3) << 16) | (b & 0xffff) as usize] += 1;
                    }
                }
            }
            // Counts per lane stay far from overflow: folded in per block.
            n += counts.iter().map(|&c| c as usize).sum::<usize>();
            counts = [0; LANES];
        }
        Lanes { n, sums, mins, maxs }
    }
}

crate::simd::dispatch! {
    /// The valid depths whose 16 high order bits (in `order_key`) are `bin`, a bin of finite
    /// values: it holds no infinity or NaN (their high bits are outside every finite value's),
    /// so the bin test alone says finite. The test is branch-free over blocks of 64 pixels (it
    /// vectorises), and only blocks with a hit are gone through again to pick the values out.
    fn bin_values / bin_values_baseline(depth: &[f32], mask: &[bool], bin: u32) -> Vec<f32> {
        let lo = bin << 16;
        let hit = |v: f32, m: bool| m & (order_key(v).wrapping_sub(lo) < 1 << 16);
        let mut out = Vec::new();
        for (d, m) in depth.chunks(64).zip(mask.chunks(64)) {
            if d.iter().zip(m).fold(false, |a, (&v, &m)| a | hit(v, m)) {
                out.extend(d.iter().zip(m).filter(|&(&v, &m)| hit(v, m)).map(|(&v, _)| v));
            }
        }
        out
    }
}

/// Whether every partial sum of `n` f32 values in [min, max] is exact in f64, so that summing
/// them in any order gives the bits of the sum in pixel order. All of them are multiples of the
/// smallest one's ulp `g` (a float's ulp is a multiple of every smaller float's), so every
/// partial sum is a multiple of `g` of magnitude at most n·max|v|, and is exact below 2^53·g.
/// Holds for depth maps spanning up to ~500x at 1080p; zeros (g = 0) or mixed signs say no.
fn sums_are_exact(n: usize, min: f32, max: f32) -> bool {
    let same_sign = (min > 0.0 && max > 0.0) || (min < 0.0 && max < 0.0);
    if !same_sign || !min.is_finite() || !max.is_finite() {
        return false;
    }
    let (small, large) = if min > 0.0 { (min, max) } else { (-max, -min) };
    if !small.is_normal() {
        return false;
    }
    // The ulp of a normal f32: 2^(exponent - 23).
    let ulp = f32::from_bits(small.to_bits() & 0x7f80_0000) as f64 * 2f64.powi(-23);
    // With a factor of 2 to spare for the rounding of the product on the left.
    (n as f64) * large as f64 <= 2f64.powi(52) * ulp
}

/// The bits of a float as an unsigned key in `f32::total_cmp` order.
#[inline(always)]
fn order_key(v: f32) -> u32 {
    let b = v.to_bits();
    // Negative: all bits flipped; positive: the sign bit set. As a select of the xor mask, so
    // that loops over it vectorise.
    b ^ ((((b as i32) >> 31) as u32) | 0x8000_0000)
}

impl Sidecar {
    /// The prediction part of the sidecar; the caller fills in provenance, timings and the depth
    /// statistics (computed once per image: the summary line shares the median).
    pub fn new(
        input: String,
        p: &Prediction,
        depth: DepthStats,
        depth_png_scale: f32,
        model: ModelInfo,
        inference: InferenceInfo,
        timings_ms: Timings,
    ) -> Self {
        let (fov_x, fov_y) = p.fov_degrees();
        Self {
            input,
            frame: None,
            width: p.width,
            height: p.height,
            fov_x,
            fov_y,
            intrinsics: p.intrinsics,
            intrinsics_pixels: p.intrinsics_pixels(),
            metric_scale: p.metric_scale,
            depth,
            depth_png: DepthPng { scale: depth_png_scale, saturated: 0 },
            has_normal: p.has_normal(),
            model,
            tool: ToolInfo::default(),
            inference,
            timings_ms,
            extra: Default::default(),
        }
    }
}

pub fn write(path: &Path, s: &Sidecar) -> Result<()> {
    let mut text = serde_json::to_string_pretty(s)?;
    text.push('\n');
    write_atomic(path, |f| {
        std::io::Write::write_all(f, text.as_bytes())?;
        Ok(())
    })
}
