//! `--fit pad|stretch --canvas WxH`: run every photo at one canvas aspect (one token grid,
//! which traced devices need), then cut the outputs back to the photo.
//!
//! * `pad` letterboxes the photo with black borders to the canvas aspect at the photo's own
//!   scale, so the network sees the canvas grid and the outputs need no resampling: the maps
//!   are cropped back, and the intrinsics re-expressed for the crop (pixel focal lengths
//!   unchanged, principal point shifted by the border).
//! * `stretch` resizes the photo to the canvas, predicts there and resamples the maps back to
//!   the photo's size. Normalised intrinsics are unchanged by an axis-aligned stretch (pixel
//!   fx and fy scale separately); with force-projection the points are re-projected from the
//!   resampled depth, so points = depth · K⁻¹ [u, v, 1] holds on the outputs.

use anyhow::{bail, Result};
use image::RgbImage;

use crate::camera::{Pinhole, View};
use crate::infer::{InferOptions, Prediction};

/// How a photo meets the network; on the wire (`fit`) by its lowercase name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FitMode {
    /// Each photo at its own aspect (upstream behaviour).
    Exact,
    /// Letterbox onto the canvas aspect, crop the outputs back.
    Pad,
    /// Stretch onto the canvas, resample the outputs back.
    Stretch,
}

crate::names::names!(FitMode, "fit", { Exact => "exact", Pad => "pad", Stretch => "stretch" });

/// `WxH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Canvas {
    pub width: u32,
    pub height: u32,
}

impl Canvas {
    /// 1920x1080, the default `--canvas`.
    pub const FULL_HD: Canvas = Canvas { width: 1920, height: 1080 };
}

impl std::str::FromStr for Canvas {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (w, h) = s.split_once(['x', 'X']).ok_or_else(|| format!("'{s}' is not WxH (e.g. 1920x1080)"))?;
        let width: u32 = w.trim().parse().map_err(|_| format!("'{w}' is not a width"))?;
        let height: u32 = h.trim().parse().map_err(|_| format!("'{h}' is not a height"))?;
        if !crate::image_io::is_supported_size(width, height) {
            return Err(format!("canvas {width}x{height} is out of range"));
        }
        Ok(Canvas { width, height })
    }
}

/// How the work image relates to the photo.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Placement {
    Exact,
    /// The photo sits at (x, y) inside a `width` x `height` work image.
    Pad {
        x: usize,
        y: usize,
        width: usize,
        height: usize,
    },
    /// The work image is the canvas.
    Stretch {
        width: usize,
        height: usize,
    },
    /// The photo of a known camera in the view the model takes of it (square pixels, the
    /// principal point at the centre).
    Camera(View),
}

/// The image the network runs on (None: the photo itself) and where the photo is in it.
pub fn place(photo: &RgbImage, mode: FitMode, canvas: Canvas) -> Result<(Option<RgbImage>, Placement)> {
    let (iw, ih) = (photo.width() as u64, photo.height() as u64);
    match mode {
        FitMode::Exact => Ok((None, Placement::Exact)),
        FitMode::Pad => {
            let (cw, ch) = (canvas.width as u64, canvas.height as u64);
            // Grow one side to reach the canvas aspect; the photo is never scaled.
            let (pw, ph) =
                if iw * ch >= ih * cw { (iw, ((iw * ch) as f64 / cw as f64).round() as u64) } else { (((ih * cw) as f64 / ch as f64).round() as u64, ih) };
            let (pw, ph) = (pw.max(iw), ph.max(ih));
            if pw * ph > crate::image_io::MAX_PIXELS {
                bail!("padded to the canvas aspect the image would be {pw}x{ph}, over the limit of {} pixels", crate::image_io::MAX_PIXELS);
            }
            let (x, y) = ((pw - iw) / 2, (ph - ih) / 2);
            let mut work = RgbImage::new(pw as u32, ph as u32);
            image::imageops::replace(&mut work, photo, x as i64, y as i64);
            let p = Placement::Pad { x: x as usize, y: y as usize, width: pw as usize, height: ph as usize };
            Ok((Some(work), p))
        }
        FitMode::Stretch => {
            let work = image::imageops::resize(photo, canvas.width, canvas.height, image::imageops::FilterType::Triangle);
            Ok((Some(work), Placement::Stretch { width: canvas.width as usize, height: canvas.height as usize }))
        }
    }
}

/// The view of a photo taken by `camera` (which is not the model's own: see
/// [`Pinhole::is_centred`]) that the network runs on, grown to the canvas aspect for `pad`.
/// `stretch` would make the pixels of the view unsquare again, and is refused.
pub fn place_camera(photo: &RgbImage, camera: &Pinhole, mode: FitMode, canvas: Canvas) -> Result<(Option<RgbImage>, Placement)> {
    let aspect = match mode {
        FitMode::Exact => None,
        FitMode::Pad => Some((canvas.width, canvas.height)),
        FitMode::Stretch => bail!("--fit stretch would make a known camera's pixels unsquare: use --fit pad or exact with a camera matrix"),
    };
    let view = camera.view(photo.width(), photo.height(), aspect, crate::image_io::MAX_PIXELS)?;
    Ok((Some(view.draw(photo)), Placement::Camera(view)))
}

/// The options for the work image: a known horizontal field of view of the photo becomes the
/// wider one of the padded image (same pixel focal length); stretching keeps it; a known
/// camera's view has its own.
pub fn work_options(opts: &InferOptions, placement: Placement, photo_width: usize) -> InferOptions {
    let mut o = opts.clone();
    if let Placement::Camera(view) = placement {
        o.fov_x = Some(view.fov_x());
        return o;
    }
    if let (Some(fov), Placement::Pad { width, .. }) = (opts.fov_x, placement) {
        let half = (fov as f64).to_radians() / 2.0;
        let t = half.tan() * width as f64 / photo_width as f64;
        o.fov_x = Some((2.0 * t.atan()).to_degrees() as f32);
    }
    o
}

/// The prediction on the work image cut back to the photo's `width` x `height`.
pub fn restore(mut pred: Prediction, placement: Placement, width: usize, height: usize, opts: &InferOptions) -> Prediction {
    // MoGe-3's maps of each step, the same way.
    let steps = std::mem::take(&mut pred.per_step);
    let one = |p: Prediction| match placement {
        Placement::Exact => p,
        Placement::Pad { x, y, .. } => crop(p, x, y, width, height),
        Placement::Stretch { .. } => {
            let (sw, sh) = (p.width as f64, p.height as f64);
            let k = p.intrinsics;
            resample(p, (width, height), [(sw, width as f64, 0.0), (sh, height as f64, 0.0)], k, opts)
        }
        // The view's pixels back to the photo's, and the camera as given.
        Placement::Camera(v) => {
            resample(p, (width, height), [(v.scale.0, 1.0, v.offset.0), (v.scale.1, 1.0, v.offset.1)], v.camera.normalised(width, height), opts)
        }
    };
    let mut pred = one(pred);
    pred.per_step = steps.into_iter().map(one).collect();
    pred
}

fn crop(p: Prediction, ox: usize, oy: usize, w: usize, h: usize) -> Prediction {
    // The w x h window at (ox, oy) of a map of `c` values per pixel.
    fn take<T: Copy>(v: &[T], c: usize, pw: usize, (ox, oy, w, h): (usize, usize, usize, usize)) -> Vec<T> {
        let mut out = Vec::with_capacity(w * h * c);
        for y in oy..oy + h {
            out.extend_from_slice(&v[(y * pw + ox) * c..(y * pw + ox + w) * c]);
        }
        out
    }
    let (pw, win) = (p.width, (ox, oy, w, h));
    let k = p.intrinsics;
    // Pixel intrinsics are those of the work image, shifted by the border; normalised by the
    // photo's size.
    let (fxp, fyp) = (k[0][0] as f64 * p.width as f64, k[1][1] as f64 * p.height as f64);
    let (cxp, cyp) = (k[0][2] as f64 * p.width as f64 - ox as f64, k[1][2] as f64 * p.height as f64 - oy as f64);
    let intrinsics = [[(fxp / w as f64) as f32, 0.0, (cxp / w as f64) as f32], [0.0, (fyp / h as f64) as f32, (cyp / h as f64) as f32], [0.0, 0.0, 1.0]];
    Prediction {
        width: w,
        height: h,
        points: take(&p.points, 3, pw, win),
        depth: take(&p.depth, 1, pw, win),
        normal: p.normal.as_ref().map(|n| take(n, 3, pw, win)),
        normal_png: p.normal_png.as_ref().map(|n| take(n, 3, pw, win)),
        mask: take(&p.mask, 1, pw, win),
        intrinsics,
        ..p
    }
}

/// The work image's maps at the photo's `w` x `h` pixels, where along each axis the photo's
/// coordinate u lies at the work image's `u · num / den + offset`; the outputs' camera is
/// `intrinsics` (normalised). Bilinear over the neighbours with a finite depth (so +inf never
/// leaks into a valid pixel), validity from the nearest work pixel.
fn resample(p: Prediction, (w, h): (usize, usize), axes: [(f64, f64, f64); 2], intrinsics: [[f32; 3]; 3], opts: &InferOptions) -> Prediction {
    let (sw, sh) = (p.width, p.height);
    let axis = |n_out: usize, n_in: usize, (num, den, offset): (f64, f64, f64)| -> Vec<(usize, usize, f32, usize)> {
        (0..n_out)
            .map(|i| {
                let at = (i as f64 + 0.5) * num / den + offset;
                let s = (at - 0.5).clamp(0.0, (n_in - 1) as f64);
                let i0 = s.floor() as usize;
                let i1 = (i0 + 1).min(n_in - 1);
                let nearest = (at.max(0.0) as usize).min(n_in - 1);
                (i0, i1, (s - i0 as f64) as f32, nearest)
            })
            .collect()
    };
    let (ax, ay) = (axis(w, sw, axes[0]), axis(h, sh, axes[1]));
    let n = w * h;
    let mut depth = vec![f32::INFINITY; n];
    let mut points = vec![f32::INFINITY; 3 * n];
    let mut normal = p.normal.as_ref().map(|_| vec![0f32; 3 * n]);
    let mut mask = vec![false; n];
    for (y, &(y0, y1, fy, ny)) in ay.iter().enumerate() {
        for (x, &(x0, x1, fx, nx)) in ax.iter().enumerate() {
            let o = y * w + x;
            let valid = p.mask[ny * sw + nx];
            mask[o] = valid;
            if opts.apply_mask && !valid {
                continue; // inf depth and points, zero normal, as infer() leaves masked pixels
            }
            let taps = [(y0 * sw + x0, (1.0 - fx) * (1.0 - fy)), (y0 * sw + x1, fx * (1.0 - fy)), (y1 * sw + x0, (1.0 - fx) * fy), (y1 * sw + x1, fx * fy)];
            let (mut wsum, mut d, mut pt, mut nm) = (0f32, 0f32, [0f32; 3], [0f32; 3]);
            for &(i, wt) in &taps {
                if wt > 0.0 && p.depth[i].is_finite() {
                    wsum += wt;
                    d += wt * p.depth[i];
                    for c in 0..3 {
                        pt[c] += wt * p.points[3 * i + c];
                        if let Some(nn) = &p.normal {
                            nm[c] += wt * nn[3 * i + c];
                        }
                    }
                }
            }
            if wsum == 0.0 {
                // No finite neighbour (only without the mask): copy the nearest pixel.
                let i = ny * sw + nx;
                depth[o] = p.depth[i];
                points[3 * o..3 * o + 3].copy_from_slice(&p.points[3 * i..3 * i + 3]);
                if let (Some(out), Some(nn)) = (normal.as_mut(), &p.normal) {
                    out[3 * o..3 * o + 3].copy_from_slice(&nn[3 * i..3 * i + 3]);
                }
                continue;
            }
            depth[o] = d / wsum;
            for c in 0..3 {
                points[3 * o + c] = pt[c] / wsum;
            }
            if let Some(out) = normal.as_mut() {
                let len = (nm[0] * nm[0] + nm[1] * nm[1] + nm[2] * nm[2]).sqrt();
                if len > 0.0 {
                    for c in 0..3 {
                        out[3 * o + c] = nm[c] / len;
                    }
                }
            }
        }
    }
    if opts.force_projection {
        // The outputs' camera over the photo's pixel grid.
        let k = intrinsics;
        for o in 0..n {
            let d = depth[o];
            if !d.is_finite() {
                continue;
            }
            let u = ((o % w) as f32 + 0.5) / w as f32;
            let v = ((o / w) as f32 + 0.5) / h as f32;
            points[3 * o] = (u - k[0][2]) / k[0][0] * d;
            points[3 * o + 1] = (v - k[1][2]) / k[1][1] * d;
            points[3 * o + 2] = d;
        }
    }
    // `normal_png` is never set here: codes cannot be resampled, so `plan::prepare` keeps the
    // float normals for any placement but the exact one.
    Prediction { width: w, height: h, points, depth, normal, mask, intrinsics, ..p }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plane(w: usize, h: usize, d: f32) -> Prediction {
        let k = [[0.8f32, 0.0, 0.5], [0.0, 1.1, 0.5], [0.0, 0.0, 1.0]];
        let mut points = Vec::new();
        for y in 0..h {
            for x in 0..w {
                let u = (x as f32 + 0.5) / w as f32;
                let v = (y as f32 + 0.5) / h as f32;
                points.extend_from_slice(&[(u - 0.5) / k[0][0] * d, (v - 0.5) / k[1][1] * d, d]);
            }
        }
        Prediction {
            width: w,
            height: h,
            points,
            depth: vec![d; w * h],
            normal: Some([0.0, 0.0, -1.0].repeat(w * h)),
            normal_png: None,
            mask: vec![true; w * h],
            intrinsics: k,
            metric_scale: 1.0,
            focal: 1.0,
            shift: 0.0,
            per_step: Vec::new(),
            grid: (2, 3),
        }
    }

    /// points = depth · K⁻¹ [u, v, 1] with u, v the normalised pixel centres.
    fn assert_projective(p: &Prediction) {
        let k = p.intrinsics;
        for y in 0..p.height {
            for x in 0..p.width {
                let i = y * p.width + x;
                let d = p.depth[i];
                let u = (x as f32 + 0.5) / p.width as f32;
                let v = (y as f32 + 0.5) / p.height as f32;
                let want = [(u - k[0][2]) / k[0][0] * d, (v - k[1][2]) / k[1][1] * d, d];
                for (c, want_c) in want.iter().enumerate() {
                    assert!((p.points[3 * i + c] - want_c).abs() < 1e-5, "pixel ({x},{y}) channel {c}");
                }
            }
        }
    }

    #[test]
    fn crop_keeps_the_camera_and_moves_the_principal_point() {
        let p = plane(20, 10, 2.0);
        let c = crop(p.clone(), 3, 2, 12, 6);
        assert_eq!((c.width, c.height), (12, 6));
        assert_projective(&c);
        // Pixel focal lengths are unchanged by a crop.
        assert!((c.intrinsics_pixels()[0][0] - p.intrinsics_pixels()[0][0]).abs() < 1e-4);
        assert!((c.intrinsics_pixels()[1][1] - p.intrinsics_pixels()[1][1]).abs() < 1e-4);
        assert!((c.intrinsics_pixels()[0][2] - (p.intrinsics_pixels()[0][2] - 3.0)).abs() < 1e-4);
    }

    /// Every map is cut to the same window, the normal PNG's codes as the float normals.
    #[test]
    fn crop_cuts_every_map_alike() {
        let mut p = plane(20, 10, 2.0);
        p.depth.iter_mut().enumerate().for_each(|(i, d)| *d += i as f32);
        p.mask.iter_mut().enumerate().for_each(|(i, m)| *m = i % 3 != 0);
        let normal: Vec<f32> = (0..3 * 200).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
        p.normal = Some(normal.clone());
        p.normal_png = Some(crate::geometry::codes::encode_normal(&normal));
        let c = crop(p, 3, 2, 12, 6);
        let at = |x: usize, y: usize| (y + 2) * 20 + x + 3;
        for (y, x) in (0..6).flat_map(|y| (0..12).map(move |x| (y, x))) {
            let i = y * 12 + x;
            assert_eq!(c.depth[i], 2.0 + at(x, y) as f32);
            assert_eq!(c.mask[i], at(x, y) % 3 != 0);
            assert_eq!(&c.normal.as_ref().unwrap()[3 * i..3 * i + 3], &normal[3 * at(x, y)..3 * at(x, y) + 3]);
        }
        assert_eq!(c.normal_png, c.normal.as_deref().map(crate::geometry::codes::encode_normal));
    }

    #[test]
    fn resample_keeps_normalised_intrinsics_and_projection() {
        let mut p = plane(32, 18, 3.0);
        // Mask a block: it must stay masked (inf) and not leak into its valid neighbours.
        for y in 0..4 {
            for x in 0..4 {
                let i = y * 32 + x;
                p.mask[i] = false;
                p.depth[i] = f32::INFINITY;
                p.points[3 * i..3 * i + 3].fill(f32::INFINITY);
            }
        }
        let r = resample(p.clone(), (20, 15), [(32.0, 20.0, 0.0), (18.0, 15.0, 0.0)], p.intrinsics, &InferOptions::default());
        assert_eq!(r.intrinsics, p.intrinsics);
        assert!(!r.mask[0] && r.depth[0].is_infinite());
        for (i, (&m, &d)) in r.mask.iter().zip(&r.depth).enumerate() {
            if m {
                assert!((d - 3.0).abs() < 1e-5, "valid pixel {i} has depth {d}");
            }
        }
        // The valid part satisfies the projection (masked pixels are inf everywhere).
        let mut valid = r.clone();
        for i in 0..valid.mask.len() {
            if !valid.mask[i] {
                valid.depth[i] = 0.0;
                valid.points[3 * i..3 * i + 3].fill(0.0);
            }
        }
        assert_projective(&valid);
    }

    #[test]
    fn pad_places_the_photo_in_the_middle_at_the_canvas_aspect() {
        let photo = RgbImage::from_pixel(40, 40, image::Rgb([9, 9, 9]));
        let (work, pl) = place(&photo, FitMode::Pad, Canvas { width: 160, height: 90 }).unwrap();
        let work = work.unwrap();
        assert_eq!((work.width(), work.height()), (71, 40));
        assert_eq!(pl, Placement::Pad { x: 15, y: 0, width: 71, height: 40 });
        assert_eq!(work.get_pixel(14, 5).0, [0, 0, 0]);
        assert_eq!(work.get_pixel(15, 5).0, [9, 9, 9]);
        assert_eq!(work.get_pixel(54, 5).0, [9, 9, 9]);
        assert_eq!(work.get_pixel(55, 5).0, [0, 0, 0]);
        // A known fov of the photo becomes the padded image's (same pixel focal).
        let o = work_options(&InferOptions { fov_x: Some(60.0), ..Default::default() }, pl, 40);
        let f_photo = 20.0 / (30f64.to_radians()).tan();
        let f_work = 35.5 / ((o.fov_x.unwrap() as f64 / 2.0).to_radians()).tan();
        assert!((f_photo - f_work).abs() < 1e-3);
    }
}
