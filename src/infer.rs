//! Upstream `MoGeModel.infer` after the network: resize the head outputs to the input size,
//! remap, solve focal and shift, build intrinsics, re-project, apply metric scale and mask.

use crate::geometry::exp::exp_in_place;
use crate::geometry::focal_shift::recover_focal_shift_sampled;
use crate::geometry::resize::{bilinear_at, bilinear_axis, BilinearRows, ColumnTaps};
use crate::geometry::uv::linspace;
use crate::model::config::RemapOutput;
use crate::model::v3::MAX_REFINE_STEPS;
use crate::model::{Model, RawOutput};

/// Base ViT tokens when none are asked for: `moge predict`/`batch`, `moge serve` and the
/// Tenstorrent MoGe-2 server (tt-MoGe, whose fixed 1920x1080 canvas is 1800 tokens) agree on it.
pub const DEFAULT_NUM_TOKENS: u32 = 1800;

/// Base ViT tokens an image may be run at (`num_tokens`): the command line and `moge serve`
/// refuse others.
pub const NUM_TOKENS: Bounds = Bounds { min: 1, max: 100_000 };

/// Resolution levels: upstream's 0..=9 span the checkpoint's `num_tokens_range`, and the
/// levels above extrapolate it.
pub const RESOLUTION_LEVELS: Bounds = Bounds { min: 0, max: 30 };

/// MoGe-3's refine steps a call may ask for.
pub const REFINE_STEPS: Bounds = Bounds { min: 0, max: MAX_REFINE_STEPS as u32 };

/// A known horizontal field of view lies strictly between these, in degrees.
pub const FOV_X_DEGREES: (f32, f32) = (0.0, 180.0);

/// The whole numbers from `min` to `max`, both included; shown as `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub min: u32,
    pub max: u32,
}

impl Bounds {
    pub fn contains(self, v: u64) -> bool {
        (self.min as u64..=self.max as u64).contains(&v)
    }

    /// `v` when it is within, else why not: `0 is not in 1..=100000`.
    pub fn check(self, v: u64) -> Result<u32, String> {
        if self.contains(v) {
            Ok(v as u32)
        } else {
            Err(format!("{v} is not in {self}"))
        }
    }
}

impl std::fmt::Display for Bounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..={}", self.min, self.max)
    }
}

/// `deg` when it is a field of view ([`FOV_X_DEGREES`]), else why not:
/// `200 is not a field of view in (0, 180) degrees`.
pub fn check_fov_x(deg: f32) -> Result<f32, String> {
    let (lo, hi) = FOV_X_DEGREES;
    if deg > lo && deg < hi {
        Ok(deg)
    } else {
        Err(format!("{deg} is not a field of view in ({lo}, {hi}) degrees"))
    }
}

/// The options of `infer()` (and of `moge predict`).
#[derive(Debug, Clone, PartialEq)]
pub struct InferOptions {
    /// Base ViT tokens; `None` uses `resolution_level`.
    pub num_tokens: Option<u32>,
    /// 0..=9 maps onto the checkpoint's `num_tokens_range` (upstream default 9).
    pub resolution_level: u32,
    /// Known horizontal field of view in degrees.
    pub fov_x: Option<f32>,
    pub force_projection: bool,
    pub apply_mask: bool,
    /// Whether the point map is wanted. False lets the one-pass post-processing
    /// ([`Model::postprocess`]) leave `Prediction::points` empty when the projection is forced:
    /// for outputs that never read it (png, json), 12 bytes per pixel neither stored nor
    /// written back (~5 ms of a 1080p photo). Everything else is unchanged.
    pub point_map: bool,
    /// Whether the float normal map is wanted. False (for outputs that only write the normal
    /// PNG) makes the post-processing store the PNG's 8-bit codes, computed on rows still in
    /// cache, in `Prediction::normal_png` instead of `Prediction::normal`: 12 bytes per pixel
    /// neither stored nor read back. The codes are those of `geometry::codes::encode_normal`.
    pub normal_map: bool,
    /// MoGe-3's refine steps: `None` runs the model's default (upstream's 3; MoGe-2 has none),
    /// 0 gives the MoGe-2 output of the same network.
    pub refine_steps: Option<u32>,
    /// Keep every step's maps (upstream's `return_per_step`): `Prediction::per_step`.
    pub per_step: bool,
}

impl Default for InferOptions {
    fn default() -> Self {
        Self {
            num_tokens: None,
            resolution_level: 9,
            fov_x: None,
            force_projection: true,
            apply_mask: true,
            point_map: true,
            normal_map: true,
            refine_steps: None,
            per_step: false,
        }
    }
}

impl InferOptions {
    /// Every option within its range ([`NUM_TOKENS`], [`RESOLUTION_LEVELS`], [`FOV_X_DEGREES`]),
    /// or the first that is not, named: `num_tokens 0 is outside 1..=100000`.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(n) = self.num_tokens.filter(|&n| !NUM_TOKENS.contains(n.into())) {
            return Err(format!("num_tokens {n} is outside {NUM_TOKENS}"));
        }
        if !RESOLUTION_LEVELS.contains(self.resolution_level.into()) {
            return Err(format!("resolution_level {} is outside {RESOLUTION_LEVELS}", self.resolution_level));
        }
        if let Some(f) = self.fov_x {
            check_fov_x(f).map_err(|why| format!("fov_x {why}"))?;
        }
        if let Some(n) = self.refine_steps.filter(|&n| !REFINE_STEPS.contains(n.into())) {
            return Err(format!("refine_steps {n} is outside {REFINE_STEPS}"));
        }
        Ok(())
    }

    /// `int(min + level/9 · (max − min))`, truncating a float64 as upstream does.
    pub fn tokens(&self, range: [u32; 2]) -> u32 {
        match self.num_tokens {
            Some(n) => n,
            None => {
                let (lo, hi) = (range[0] as f64, range[1] as f64);
                (lo + (self.resolution_level as f64 / 9.0) * (hi - lo)) as u32
            }
        }
    }
}

/// Per-image geometry, all maps at the input resolution, OpenCV camera axes
/// (x right, y down, z forward), metres when the model has a metric scale head.
#[derive(Debug, Clone)]
pub struct Prediction {
    pub width: usize,
    pub height: usize,
    /// (H, W, 3) interleaved; +inf where masked (with `apply_mask`).
    pub points: Vec<f32>,
    /// (H, W); +inf where masked.
    pub depth: Vec<f32>,
    /// (H, W, 3) unit normals, zero where masked; None for models without a normal head, or
    /// when only their PNG codes were asked for (`InferOptions::normal_map` false).
    pub normal: Option<Vec<f32>>,
    /// (H, W, 3) the normal PNG's codes, when they were made in place of `normal`.
    pub normal_png: Option<Vec<u8>>,
    /// (H, W), true = valid.
    pub mask: Vec<bool>,
    /// Normalised intrinsics (image = unit square), row-major.
    pub intrinsics: [[f32; 3]; 3],
    /// exp of the scale head (1 without one).
    pub metric_scale: f32,
    /// The recovered focal (relative to the half diagonal) and z-shift.
    pub focal: f32,
    pub shift: f32,
    /// MoGe-3 with `per_step`: every step's maps, step 0 (unrefined) first and the final step
    /// last (upstream's `*_per_step`), each masked by its own mask; without normals.
    pub per_step: Vec<Prediction>,
    /// Tokens actually used: (rows, cols) of the ViT grid.
    pub grid: (usize, usize),
}

impl Prediction {
    /// Whether the model predicted normals (as floats or as PNG codes).
    pub fn has_normal(&self) -> bool {
        self.normal.is_some() || self.normal_png.is_some()
    }

    /// The prediction at another metric scale: points and depth scaled by `scale /
    /// metric_scale` (upstream multiplies both by the scale; the rest does not depend on it).
    pub fn rescale(&mut self, scale: f32) {
        let k = scale / self.metric_scale;
        if k.is_finite() && k > 0.0 {
            self.points.iter_mut().for_each(|v| *v *= k);
            self.depth.iter_mut().for_each(|v| *v *= k);
            self.metric_scale = scale;
        }
    }

    pub fn intrinsics_pixels(&self) -> [[f32; 3]; 3] {
        let (w, h) = (self.width as f32, self.height as f32);
        let k = self.intrinsics;
        [[k[0][0] * w, 0.0, k[0][2] * w], [0.0, k[1][1] * h, k[1][2] * h], [0.0, 0.0, 1.0]]
    }

    /// Horizontal and vertical field of view in degrees: 2·atan(0.5/f).
    pub fn fov_degrees(&self) -> (f32, f32) {
        let f = |k: f32| (2.0 * (0.5 / k as f64).atan()).to_degrees() as f32;
        (f(self.intrinsics[0][0]), f(self.intrinsics[1][1]))
    }

    pub fn valid_fraction(&self) -> f64 {
        if self.mask.is_empty() {
            return 0.0;
        }
        self.mask.iter().filter(|&&m| m).count() as f64 / self.mask.len() as f64
    }

    /// Median of the finite depths under the mask; NaN when there is none.
    pub fn median_depth(&self) -> f32 {
        let mut d: Vec<f32> = self.depth.iter().zip(&self.mask).filter(|(v, &m)| m && v.is_finite()).map(|(v, _)| *v).collect();
        if d.is_empty() {
            return f32::NAN;
        }
        let mid = d.len() / 2;
        let (_, m, _) = d.select_nth_unstable_by(mid, f32::total_cmp);
        *m
    }

    /// `MoGeOutput(1920x1080, valid 90.5%, median depth 13.322 m, fov_x 86.1 deg, ...)`.
    pub fn summary(&self) -> String {
        self.summary_with_median(self.median_depth())
    }

    /// [`Prediction::summary`] with the median depth already known.
    pub fn summary_with_median(&self, median_depth: f32) -> String {
        let (fx, fy) = self.fov_degrees();
        format!(
            "MoGeOutput({}x{}, valid {:.1}%, median depth {:.3} m, fov_x {:.1} deg, fov_y {:.1} deg, metric_scale {:.4})",
            self.width,
            self.height,
            100.0 * self.valid_fraction(),
            median_depth,
            fx,
            fy,
            self.metric_scale
        )
    }
}

/// `remap_output` of one point, as upstream `forward()` applies it.
#[inline]
pub fn remap_point(remap: RemapOutput, p: &mut [f32]) {
    match remap {
        RemapOutput::Linear => {}
        RemapOutput::Exp => {
            let z = p[2].exp();
            p[0] *= z;
            p[1] *= z;
            p[2] = z;
        }
        RemapOutput::Sinh => p.iter_mut().for_each(|v| *v = v.sinh()),
        RemapOutput::SinhExp => {
            p[0] = p[0].sinh();
            p[1] = p[1].sinh();
            p[2] = p[2].exp();
        }
    }
}

/// [`remap_point`] of a point whose z is already `exp(z)` (remaps `Exp` and `SinhExp`).
#[inline]
fn remap_point_after_exp(remap: RemapOutput, p: &mut [f32]) {
    match remap {
        RemapOutput::Exp => {
            p[0] *= p[2];
            p[1] *= p[2];
        }
        RemapOutput::SinhExp => {
            p[0] = p[0].sinh();
            p[1] = p[1].sinh();
        }
        RemapOutput::Linear | RemapOutput::Sinh => unreachable!("z is exp(z) only for Exp and SinhExp"),
    }
}

/// `F.normalize(normal, dim=-1)`: v / max(|v|, 1e-12).
#[inline]
pub fn normalized(a: f32, b: f32, c: f32) -> (f32, f32, f32) {
    let norm = (a * a + b * b + c * c).sqrt().max(1e-12);
    (a / norm, b / norm, c / norm)
}

/// The mask head's `sigmoid`, as upstream `forward()` applies it.
#[inline]
pub fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

/// Appends three planar rows interleaved (a0 b0 c0 a1 ...), each value through `f`, straight
/// into `map`'s spare capacity: zeroing a full-size map a row at a time before overwriting it
/// (24 MB for a 1080p normal map) cost more than the interleave itself.
#[inline(always)]
fn push_interleaved<T>(map: &mut Vec<T>, [a, b, c]: [&[f32]; 3], f: impl Fn(f32) -> T) {
    let n = a.len().min(b.len()).min(c.len());
    map.reserve(3 * n);
    let spare = &mut map.spare_capacity_mut()[..3 * n];
    for (v, ((&x, &y), &z)) in spare.chunks_exact_mut(3).zip(a.iter().zip(b).zip(c)) {
        v[0].write(f(x));
        v[1].write(f(y));
        v[2].write(f(z));
    }
    // SAFETY: the loop wrote all 3 x n values after the first `len` (n chunks of 3 in `spare`).
    unsafe { map.set_len(map.len() + 3 * n) };
}

/// Mask logits at least this far from 0 decide `sigmoid(v) > 0.5` by their sign alone: where
/// v >= 1e-3, e^-v <= 0.9990 and the quotient is >= 0.50025, far above 0.5 for any expf within
/// a few ulps; where v <= -1e-3 it is <= 0.49975.
const MASK_SURE: f32 = 1e-3;

/// `sigmoid(v) > 0.5` as `infer()` thresholds the mask, without the exp where the answer
/// cannot depend on it (NaN falls through to the full expression, false as there).
#[inline]
fn mask_valid(v: f32) -> bool {
    if v >= MASK_SURE {
        true
    } else if v <= -MASK_SURE {
        false
    } else {
        sigmoid(v) > 0.5
    }
}

/// [`mask_valid`] over a row: the sign test over the whole row (it vectorises), then the exact
/// expression for the few logits within [`MASK_SURE`] of 0. NaN is neither sure nor in the
/// band, and is invalid, as `mask_valid` has it.
#[inline(always)]
fn mask_valid_row(logits: &[f32], valid: &mut [bool]) {
    let mut unsure = false;
    for (v, &l) in valid.iter_mut().zip(logits) {
        *v = l >= MASK_SURE;
        unsure |= l > -MASK_SURE && l < MASK_SURE;
    }
    if unsure {
        for (v, &l) in valid.iter_mut().zip(logits) {
            if l > -MASK_SURE && l < MASK_SURE {
                *v = sigmoid(l) > 0.5;
            }
        }
    }
}

/// `v` where `keep`, else `other`, through the bits: a select the compiler keeps in registers
/// (a conditional store became `vmaskmovps`, microcoded and slow on AMD).
#[inline(always)]
fn select_bits(keep: bool, v: f32, other: f32) -> f32 {
    let k = u32::from(keep).wrapping_neg();
    f32::from_bits((v.to_bits() & k) | (other.to_bits() & !k))
}

/// The focal and the normalised intrinsics `infer()` builds from it.
pub fn intrinsics_of(focal: f32, width: usize, height: usize) -> [[f32; 3]; 3] {
    let aspect = width as f64 / height as f64;
    let diag = (1.0 + aspect * aspect).sqrt();
    let fx = focal / 2.0 * diag as f32 / aspect as f32;
    let fy = focal / 2.0 * diag as f32;
    [[fx, 0.0, 0.5], [0.0, fy, 0.5], [0.0, 0.0, 1.0]]
}

/// The focal `infer()` derives from a known horizontal field of view.
pub fn given_focal(opts: &InferOptions, width: usize, height: usize) -> Option<f32> {
    let aspect = width as f64 / height as f64;
    let diag = (1.0 + aspect * aspect).sqrt();
    opts.fov_x.map(|fov| {
        let half = (fov * (std::f32::consts::PI / 180.0)) / 2.0;
        (1.0 / half.tan()) * (aspect / diag) as f32
    })
}

/// `(u − 0.5) / f` per pixel centre along one axis: utils3d `depth_map_to_point_map` with
/// pixel centres in [0, 1], so that X = ray · depth.
pub fn rays(n: usize, f: f32) -> Vec<f32> {
    linspace(0.5 / n as f64, 1.0 - 0.5 / n as f64, n).iter().map(|&u| (u - 0.5) / f).collect()
}

/// Upstream `MoGeModel.infer` on a loaded model: the network's part is [`Model`]'s, the
/// post-processing is this module's.
impl Model {
    /// Host post-processing of one forward (any thread): the one way from a [`RawOutput`] to a
    /// [`Prediction`].
    pub fn postprocess(&self, raw: &RawOutput, prep_meta: (usize, usize, (usize, usize)), opts: &InferOptions) -> Prediction {
        let (width, height, grid) = prep_meta;
        let mut pred = postprocess_raw(raw, self.config.remap_output, width, height, grid, opts);
        if !raw.points_per_step.is_empty() {
            // Each earlier step solved for its own focal and shift (v3's `infer`); the last is
            // the final prediction without its normals.
            let step = |points: &Vec<f32>| {
                let view = RawOutput {
                    size: raw.size,
                    points: points.clone(),
                    normal: None,
                    mask: raw.mask.clone(),
                    metric_scale: raw.metric_scale,
                    ..RawOutput::default()
                };
                postprocess_raw(&view, self.config.remap_output, width, height, grid, opts)
            };
            let mut steps: Vec<Prediction> = raw.points_per_step.iter().map(step).collect();
            let normals = (pred.normal.take(), pred.normal_png.take());
            steps.push(pred.clone());
            (pred.normal, pred.normal_png) = normals;
            pred.per_step = steps;
        }
        pred
    }

    /// The refine steps `opts` asks of this model.
    pub fn refine_steps(&self, opts: &InferOptions) -> usize {
        opts.refine_steps.map_or(self.default_refine_steps(), |n| n as usize)
    }

    /// `infer()` on one 8-bit RGB image: prepare, forward, post-process.
    pub fn infer(&self, image: &image::RgbImage, opts: &InferOptions) -> anyhow::Result<Prediction> {
        let (w, h) = (image.width() as usize, image.height() as usize);
        let prep = self.prepare(image.as_raw(), w, h, opts.tokens(self.config.num_tokens_range)).refined(self.refine_steps(opts), opts.per_step);
        let raw = self.forward(&prep)?;
        Ok(self.postprocess(&raw, (w, h, prep.grid), opts))
    }

    /// `infer()` on a photo file, read as `moge predict` reads it (EXIF orientation applied,
    /// damaged files refused with the reason).
    pub fn infer_file(&self, path: &std::path::Path, opts: &InferOptions) -> anyhow::Result<Prediction> {
        let photo = crate::image_io::load_rgb_with(path, &crate::image_io::DecodeOptions::default())?.image;
        self.infer(&photo, opts)
    }
}

/// Upstream's `forward()` tail then `infer()`'s post-processing in one pass over the output,
/// with the same numbers bit for bit (tests/it/host_paths.rs holds it beside the two steps
/// transcribed, tests/it/support/two_step.rs): the focal/shift solve reads its
/// 64x64 samples computed alone, then each output row is interpolated, remapped, shifted,
/// projected, scaled and masked while it is in cache, and written once into the maps. No
/// full-size temporary, and the x and y of the points are not interpolated when the projection
/// replaces them. Compiled for the widest vectors the CPU has (the same arithmetic, so the
/// same bits, at every level).
fn postprocess_raw(raw: &RawOutput, remap: RemapOutput, width: usize, height: usize, grid: (usize, usize), opts: &InferOptions) -> Prediction {
    postprocess_rows(crate::simd::isa::current(), raw, remap, width, height, grid, opts)
}

crate::simd::dispatch! {
    fn postprocess_rows / postprocess_rows_baseline(raw: &RawOutput, remap: RemapOutput, width: usize, height: usize, grid: (usize, usize), opts: &InferOptions) -> Prediction {
        let (h, w) = raw.size;
        let plane = h * w;
        let (xs, ys) = (bilinear_axis(w, width), bilinear_axis(h, height));
        let points_plane = |c: usize| &raw.points[c * plane..(c + 1) * plane];
        let metric_scale = raw.metric_scale.map(f32::exp);

        let fs = recover_focal_shift_sampled(width, height, given_focal(opts, width, height), |x, y| {
            if let Some(m) = &raw.mask {
                if !mask_valid(bilinear_at(m, w, xs[x], ys[y])) {
                    return None;
                }
            }
            let mut p = [0, 1, 2].map(|c| bilinear_at(points_plane(c), w, xs[x], ys[y]));
            remap_point(remap, &mut p);
            Some(p)
        });
        let intrinsics = intrinsics_of(fs.focal, width, height);
        let (fx, fy) = (intrinsics[0][0], intrinsics[1][1]);
        let (ray_x, ray_y) = (rays(width, fx), rays(height, fy));

        // The maps are filled a row at a time from row buffers that stay in cache; they are never
        // zeroed first (56 MB per 1080p image).
        let n = width * height;
        let mut points = Vec::with_capacity(3 * n);
        let mut depth = Vec::with_capacity(n);
        // The float normals, or (`normal_map` false) their PNG codes in their place.
        let mut normal = raw.normal.as_ref().filter(|_| opts.normal_map).map(|_| Vec::with_capacity(3 * n));
        let mut normal_png = raw.normal.as_ref().filter(|_| !opts.normal_map).map(|_| Vec::with_capacity(3 * n));
        let mut mask = Vec::with_capacity(n);
        let project = opts.force_projection;
        // Without the projection the row of points is where the depth is computed.
        let keep_points = opts.point_map || !project;
        let masking = opts.apply_mask && raw.mask.is_some();
        // Interpolated rows: the points' z (and x, y unless projected), the normal, the mask logits.
        let cols = ColumnTaps::new(&xs);
        let mut pz = BilinearRows::new(points_plane(2), w, &cols);
        let mut pxy = (!project).then(|| [BilinearRows::new(points_plane(0), w, &cols), BilinearRows::new(points_plane(1), w, &cols)]);
        let mut nrm = raw.normal.as_ref().map(|d| [0, 1, 2].map(|c| BilinearRows::new(&d[c * plane..(c + 1) * plane], w, &cols)));
        let mut msk = raw.mask.as_ref().map(|d| BilinearRows::new(d, w, &cols));
        let mut row = [vec![0f32; width], vec![0f32; width], vec![0f32; width]];
        let mut nrow = [vec![0f32; width], vec![0f32; width], vec![0f32; width]];
        let mut mrow = vec![0f32; width];
        let mut valid = vec![true; width];

        for (y, &ty) in ys.iter().enumerate() {
            // This row of each map, computed in place (a row at a time, so it stays in cache).
            let grow = |m: &mut Vec<f32>, k: usize| {
                let at = m.len();
                m.resize(at + k * width, 0.0);
                at
            };
            if let Some(m) = msk.as_mut() {
                m.row(ty, &mut mrow);
                mask_valid_row(&mrow, &mut valid);
            }
            pz.row(ty, &mut row[2]);
            if let Some([px, py]) = pxy.as_mut() {
                px.row(ty, &mut row[0]);
                py.row(ty, &mut row[1]);
            }
            let has_mask = raw.mask.is_some();
            // exp(z) over the row at once (libm's bits, vectorised); the rest of the remap follows.
            let z_done = matches!(remap, RemapOutput::Exp | RemapOutput::SinhExp);
            if z_done {
                exp_in_place(&mut row[2]);
            }
            if project {
                // Only z survives the projection: its remap alone (exp done above, sinh per pixel),
                // then the rest over whole planar rows, which vectorise: shift, validity,
                // x, y = ray · depth, scale, mask, and one interleaving store.
                let [px, py, z] = &mut row;
                if remap == RemapOutput::Sinh {
                    z.iter_mut().for_each(|v| *v = v.sinh());
                }
                z.iter_mut().for_each(|v| *v += fs.shift);
                if has_mask {
                    valid.iter_mut().zip(z.iter()).for_each(|(m, &v)| *m &= v > 0.0);
                }
                // x and y only for a kept point map (each is computed from z alone).
                let xy = if keep_points { width } else { 0 };
                let (px, py) = (&mut px[..xy], &mut py[..xy]);
                let ry = ray_y[y];
                for (((x, yv), &zv), &rx) in px.iter_mut().zip(py.iter_mut()).zip(z.iter()).zip(&ray_x) {
                    *x = rx * zv;
                    *yv = ry * zv;
                }
                // Element by element, each row on its own (x and y are empty when not kept).
                if let Some(s) = metric_scale {
                    for r in [&mut px[..], &mut py[..], &mut z[..]] {
                        r.iter_mut().for_each(|v| *v *= s);
                    }
                }
                if masking {
                    for r in [&mut px[..], &mut py[..], &mut z[..]] {
                        r.iter_mut().zip(valid.iter()).for_each(|(v, &m)| *v = select_bits(m, *v, f32::INFINITY));
                    }
                }
                depth.extend_from_slice(z);
                if keep_points {
                    push_interleaved(&mut points, [&px[..], &py[..], &z[..]], |v| v);
                }
            } else {
                let (pa, da) = (grow(&mut points, 3), grow(&mut depth, 1));
                let (prow, drow) = (&mut points[pa..], &mut depth[da..]);
                for (i, (p, d)) in prow.chunks_exact_mut(3).zip(drow.iter_mut()).enumerate() {
                    p.copy_from_slice(&[row[0][i], row[1][i], row[2][i]]);
                    if z_done {
                        remap_point_after_exp(remap, p);
                    } else {
                        remap_point(remap, p);
                    }
                    p[2] += fs.shift;
                    if has_mask {
                        valid[i] &= p[2] > 0.0;
                    }
                    *d = p[2];
                }
                if let Some(s) = metric_scale {
                    prow.iter_mut().for_each(|v| *v *= s);
                    drow.iter_mut().for_each(|v| *v *= s);
                }
                if masking {
                    for (i, _) in valid.iter().enumerate().filter(|(_, &v)| !v) {
                        prow[3 * i..3 * i + 3].fill(f32::INFINITY);
                        drow[i] = f32::INFINITY;
                    }
                }
            }
            if let Some(nr) = nrm.as_mut() {
                for (r, buf) in nr.iter_mut().zip(nrow.iter_mut()) {
                    r.row(ty, buf);
                }
                // Normalised on planar rows (vectorises), then interleaved.
                let [n0, n1, n2] = &mut nrow;
                for ((a, b), c) in n0.iter_mut().zip(n1.iter_mut()).zip(n2.iter_mut()) {
                    (*a, *b, *c) = normalized(*a, *b, *c);
                }
                if masking {
                    for (((a, b), c), &m) in n0.iter_mut().zip(n1.iter_mut()).zip(n2.iter_mut()).zip(valid.iter()) {
                        (*a, *b, *c) = (select_bits(m, *a, 0.0), select_bits(m, *b, 0.0), select_bits(m, *c, 0.0));
                    }
                }
                if let Some(nmap) = normal.as_mut() {
                    push_interleaved(nmap, [&n0[..], &n1[..], &n2[..]], |v| v);
                }
                if let Some(codes) = normal_png.as_mut() {
                    push_interleaved(codes, [&n0[..], &n1[..], &n2[..]], crate::geometry::codes::normal_code);
                }
            }
            mask.extend_from_slice(&valid);
        }
        Prediction {
            width,
            height,
            points,
            depth,
            normal,
            normal_png,
            mask,
            intrinsics,
            metric_scale: metric_scale.unwrap_or(1.0),
            focal: fs.focal,
            shift: fs.shift,
            per_step: Vec::new(),
            grid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shortcut thresholds agree with `sigmoid(v) > 0.5` everywhere: every float near the
    /// band's edges and near 0 (where the exact expression decides), a sweep across it, and the
    /// specials.
    #[test]
    fn mask_thresholds_match_the_sigmoid() {
        let mut logits = vec![0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE, -f32::MIN_POSITIVE, 1.0, -1.0, 80.0, -80.0];
        for edge in [MASK_SURE, -MASK_SURE, 6e-8, -6e-8, 3e-8, -3e-8] {
            let b = edge.to_bits();
            logits.extend((b - 2000..b + 2000).map(f32::from_bits));
        }
        logits.extend((-20_000..20_000).map(|i| i as f32 * 1.3e-7));
        logits.extend((-2000..2000).map(|i| i as f32 * 3.7e-3));
        let want: Vec<bool> = logits.iter().map(|&v| sigmoid(v) > 0.5).collect();
        let got: Vec<bool> = logits.iter().map(|&v| mask_valid(v)).collect();
        assert_eq!(got, want);
        let mut row = vec![false; logits.len()];
        mask_valid_row(&logits, &mut row);
        assert_eq!(row, want);
        // Both outcomes occur inside the band, so it is the exact expression that decides there.
        let band: Vec<bool> = logits.iter().zip(&want).filter(|(v, _)| v.abs() < MASK_SURE).map(|(_, &w)| w).collect();
        assert!(band.contains(&true) && band.contains(&false));
        // A row with no logit in the band skips the second pass and is still right.
        let sure = [2.0f32, -2.0, 0.5, -0.5, f32::NAN];
        let mut r = [true; 5];
        mask_valid_row(&sure, &mut r);
        assert_eq!(r, [true, false, true, false, false]);
    }

    #[test]
    fn select_bits_is_a_select() {
        for (keep, v, other) in [(true, -0.0f32, 0.0), (false, 3.5, f32::INFINITY), (true, f32::NAN, 0.0), (false, f32::NAN, 0.0), (true, -2.0, 0.0)] {
            let want = if keep { v } else { other };
            assert_eq!(select_bits(keep, v, other).to_bits(), want.to_bits());
        }
    }

    /// The limits in the words the command line and moge serve give them.
    #[test]
    fn limits_name_the_value_and_the_range() {
        assert_eq!(NUM_TOKENS.check(0), Err("0 is not in 1..=100000".into()));
        assert_eq!(NUM_TOKENS.check(100_000), Ok(100_000));
        assert_eq!(RESOLUTION_LEVELS.check(u64::MAX), Err(format!("{} is not in 0..=30", u64::MAX)));
        assert_eq!(check_fov_x(180.0), Err("180 is not a field of view in (0, 180) degrees".into()));
        assert_eq!(check_fov_x(0.5), Ok(0.5));
        let bad = |o: InferOptions| o.validate().unwrap_err();
        let d = InferOptions::default();
        assert_eq!(bad(InferOptions { num_tokens: Some(100_001), ..d.clone() }), "num_tokens 100001 is outside 1..=100000");
        assert_eq!(bad(InferOptions { resolution_level: 31, ..d.clone() }), "resolution_level 31 is outside 0..=30");
        assert_eq!(bad(InferOptions { fov_x: Some(f32::NAN), ..d.clone() }), "fov_x NaN is not a field of view in (0, 180) degrees");
        assert_eq!(d.validate(), Ok(()));
    }
}
