//! Cameras as users have them: a pinhole camera matrix in pixels, and the view of the photo that
//! MoGe-2 takes of it (square pixels, the principal point at the image's centre).
//!
//! A camera with fx != fy or an off-centre principal point is brought to the model without
//! approximation: the photo is resampled to square pixels (the axis with the shorter focal
//! length stretched, so no detail is lost), placed in a larger black image whose centre is the
//! principal point, and run with that image's horizontal field of view (the shift-only solve of
//! `--fov-x`); `fit::restore` maps every output back to the photo's pixels and camera. The
//! per-photo tables (`--intrinsics-from`) are in [`table`].

pub mod table;

use anyhow::{bail, Result};
use image::RgbImage;

/// A pinhole camera in pixels, in COLMAP's (and MoGe's) convention: the image's top-left corner
/// is (0, 0), so the first pixel's centre is (0.5, 0.5) and a centred principal point is
/// (w/2, h/2). OpenCV's cx and cy are 0.5 less.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pinhole {
    pub fx: f64,
    pub fy: f64,
    pub cx: f64,
    pub cy: f64,
}

/// How far from square pixels and a centred principal point a camera may be and still be run as
/// it is (the bit-for-bit path of `--fov-x`): a millionth of a pixel.
const SAME: f64 = 1e-6;

impl Pinhole {
    /// `[fx, fy, cx, cy]`, checked: positive, finite focal lengths and a finite principal point.
    pub fn new(k: [f64; 4]) -> Result<Pinhole, String> {
        let [fx, fy, cx, cy] = k;
        if !(fx.is_finite() && fx > 0.0 && fy.is_finite() && fy > 0.0) {
            return Err(format!("focal lengths fx {fx}, fy {fy} are not positive pixels"));
        }
        if !(cx.is_finite() && cy.is_finite()) {
            return Err(format!("principal point ({cx}, {cy}) is not finite"));
        }
        Ok(Pinhole { fx, fy, cx, cy })
    }

    /// The horizontal field of view, degrees, over a photo `width` pixels wide.
    pub fn fov_x(&self, width: u32) -> f64 {
        (2.0 * (width as f64 / (2.0 * self.fx)).atan()).to_degrees()
    }

    /// Whether this is the camera MoGe-2 assumes for a `width` x `height` photo: square pixels
    /// and the principal point at the centre (then only its field of view is needed).
    pub fn is_centred(&self, width: u32, height: u32) -> bool {
        (self.fx - self.fy).abs() <= SAME * self.fx
            && (self.cx - width as f64 / 2.0).abs() <= SAME * width as f64
            && (self.cy - height as f64 / 2.0).abs() <= SAME * height as f64
    }

    /// The row-major matrix normalised by the photo's size (the npz's `intrinsics`).
    pub fn normalised(&self, width: usize, height: usize) -> [[f32; 3]; 3] {
        let (w, h) = (width as f64, height as f64);
        [[(self.fx / w) as f32, 0.0, (self.cx / w) as f32], [0.0, (self.fy / h) as f32, (self.cy / h) as f32], [0.0, 0.0, 1.0]]
    }

    /// The view of a `width` x `height` photo taken by this camera that the model takes: square
    /// pixels, the principal point at the centre; grown to `aspect` (w, h) around that centre when
    /// given (`--fit pad`). Refused: a principal point outside the photo, and a view over
    /// `max_pixels`.
    pub fn view(&self, width: u32, height: u32, aspect: Option<(u32, u32)>, max_pixels: u64) -> Result<View> {
        let (w, h) = (width as f64, height as f64);
        if !(self.cx > 0.0 && self.cx < w && self.cy > 0.0 && self.cy < h) {
            bail!("the principal point ({}, {}) lies outside the {width}x{height} photo", self.cx, self.cy);
        }
        // Stretch the axis with the shorter focal length up to the longer one.
        let focal = self.fx.max(self.fy);
        let scale = (focal / self.fx, focal / self.fy);
        let half = |s: f64, c: f64, n: f64| (s * c).max(s * (n - c));
        // The least whole size with the principal point at its centre. A principal point on a
        // whole or half pixel gives whole offsets: the photo is then copied, not resampled.
        let side = |half: f64| ((2.0 * half - 1e-9).ceil()).max(1.0);
        let (mut vw, mut vh) = (side(half(scale.0, self.cx, w)), side(half(scale.1, self.cy, h)));
        if let Some((aw, ah)) = aspect {
            let (aw, ah) = (aw as f64, ah as f64);
            if vw * ah >= vh * aw {
                vh = vh.max((vw * ah / aw).round());
            } else {
                vw = vw.max((vh * aw / ah).round());
            }
        }
        if vw * vh > max_pixels as f64 {
            bail!("with square pixels and the principal point at its centre, the photo's view would be {vw}x{vh}, over the limit of {max_pixels} pixels");
        }
        let offset = (vw / 2.0 - scale.0 * self.cx, vh / 2.0 - scale.1 * self.cy);
        Ok(View { camera: *self, photo: (width as usize, height as usize), width: vw as usize, height: vh as usize, scale, offset, focal })
    }
}

impl std::fmt::Display for Pinhole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fx {} fy {} cx {} cy {}", self.fx, self.fy, self.cx, self.cy)
    }
}

/// A photo as the model takes it: `width` x `height` pixels, where the photo's continuous
/// coordinate u (pixels from its left edge) lies at `scale.0 · u + offset.0`, and likewise
/// for y.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct View {
    /// The photo's camera.
    pub camera: Pinhole,
    /// The photo's size.
    pub photo: (usize, usize),
    pub width: usize,
    pub height: usize,
    pub scale: (f64, f64),
    pub offset: (f64, f64),
    /// The view's focal length in its pixels (square).
    pub focal: f64,
}

impl View {
    /// The view's horizontal field of view, degrees: what the model is given.
    pub fn fov_x(&self) -> f32 {
        (2.0 * (self.width as f64 / (2.0 * self.focal)).atan()).to_degrees() as f32
    }

    /// The photo is placed by whole pixels, unscaled: a copy.
    fn is_copy(&self) -> bool {
        let whole = |v: f64| (v - v.round()).abs() < 1e-9;
        self.scale == (1.0, 1.0) && whole(self.offset.0) && whole(self.offset.1)
    }

    /// The photo drawn into the view: copied where it lands on whole pixels unscaled, else
    /// resampled bilinearly (the view's scale is at least 1, so nothing aliases); black where
    /// the photo does not reach.
    pub fn draw(&self, photo: &RgbImage) -> RgbImage {
        let mut out = RgbImage::new(self.width as u32, self.height as u32);
        if self.is_copy() {
            image::imageops::replace(&mut out, photo, self.offset.0.round() as i64, self.offset.1.round() as i64);
            return out;
        }
        // Per view column (row): the photo's two neighbouring columns and the weight of the
        // second, or None where the view's pixel centre is off the photo.
        let taps = |n_out: usize, n_in: usize, scale: f64, offset: f64| -> Vec<Option<(usize, usize, f32)>> {
            (0..n_out)
                .map(|i| {
                    let u = (i as f64 + 0.5 - offset) / scale;
                    if !(0.0..=n_in as f64).contains(&u) {
                        return None;
                    }
                    let s = (u - 0.5).clamp(0.0, (n_in - 1) as f64);
                    let i0 = s.floor() as usize;
                    Some((i0, (i0 + 1).min(n_in - 1), (s - i0 as f64) as f32))
                })
                .collect()
        };
        let (pw, ph) = (photo.width() as usize, photo.height() as usize);
        let (tx, ty) = (taps(self.width, pw, self.scale.0, self.offset.0), taps(self.height, ph, self.scale.1, self.offset.1));
        let src = photo.as_raw();
        let dst: &mut [u8] = &mut out;
        for (y, ty) in ty.iter().enumerate() {
            let Some((y0, y1, wy)) = *ty else { continue };
            for (x, tx) in tx.iter().enumerate() {
                let Some((x0, x1, wx)) = *tx else { continue };
                let at = |yy: usize, xx: usize, c: usize| src[(yy * pw + xx) * 3 + c] as f32;
                for c in 0..3 {
                    let top = at(y0, x0, c) * (1.0 - wx) + at(y0, x1, c) * wx;
                    let bottom = at(y1, x0, c) * (1.0 - wx) + at(y1, x1, c) * wx;
                    dst[(y * self.width + x) * 3 + c] = (top * (1.0 - wy) + bottom * wy).round().clamp(0.0, 255.0) as u8;
                }
            }
        }
        out
    }

    /// What the sidecar says of how the photo was run.
    pub fn describe(&self) -> String {
        let mut did = Vec::new();
        if self.scale != (1.0, 1.0) {
            did.push(format!("resampled to square pixels ({:.4} x {:.4})", self.scale.0, self.scale.1));
        }
        did.push(format!("placed in a {}x{} view with the principal point at its centre", self.width, self.height));
        did.join(", ")
    }
}

/// What one camera's photos share (`--camera shared`, `pipeline::shared_camera`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SharedCamera {
    /// The folder of the photos, or the video.
    pub group: std::path::PathBuf,
    /// Degrees: the median of the sample's estimates.
    pub fov_x: f32,
    /// The median of the sample's metric scales, where it is shared too.
    pub metric_scale: Option<f32>,
    /// How many of the group's photos (frames) the first pass ran on, and the least and most
    /// field of view among them.
    pub sampled: usize,
    pub fov_x_range: (f32, f32),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(fx: f64, fy: f64, cx: f64, cy: f64) -> Pinhole {
        Pinhole::new([fx, fy, cx, cy]).unwrap()
    }

    /// The principal point lands on the view's centre, the photo inside the view, the pixels
    /// square.
    #[test]
    fn the_view_centres_the_principal_point_with_square_pixels() {
        for cam in [k(70.0, 75.0, 10.0, 30.0), k(100.0, 100.0, 52.3, 20.7), k(90.0, 60.0, 70.5, 40.0)] {
            let v = cam.view(80, 60, None, u64::MAX).unwrap();
            assert!((v.scale.0 * cam.cx + v.offset.0 - v.width as f64 / 2.0).abs() < 1e-9, "{cam}");
            assert!((v.scale.1 * cam.cy + v.offset.1 - v.height as f64 / 2.0).abs() < 1e-9, "{cam}");
            assert!((cam.fx * v.scale.0 - cam.fy * v.scale.1).abs() < 1e-9 && v.scale.0 >= 1.0 && v.scale.1 >= 1.0);
            assert!(v.offset.0 >= 0.0 && v.offset.0 + 80.0 * v.scale.0 <= v.width as f64 + 1e-9);
            assert!(v.offset.1 >= 0.0 && v.offset.1 + 60.0 * v.scale.1 <= v.height as f64 + 1e-9);
            // Least: one pixel less would cut the photo.
            assert!(v.width as f64 - 1.0 < 2.0 * (v.scale.0 * cam.cx).max(v.scale.0 * (80.0 - cam.cx)));
        }
    }

    /// A whole-pixel principal point is a copy; any other is resampled, and a pixel of the
    /// photo is found where the view's geometry says.
    #[test]
    fn drawing_copies_or_resamples_to_the_same_place() {
        let photo = RgbImage::from_fn(20, 10, |x, y| image::Rgb([(x * 12) as u8, (y * 25) as u8, 7]));
        let v = k(30.0, 30.0, 6.0, 4.0).view(20, 10, None, u64::MAX).unwrap();
        assert!(v.is_copy());
        assert_eq!((v.width, v.height, v.offset), (28, 12, (8.0, 2.0)));
        let d = v.draw(&photo);
        assert_eq!(d.get_pixel(8 + 3, 2 + 5), photo.get_pixel(3, 5));
        assert_eq!(d.get_pixel(0, 0).0, [0, 0, 0]);
        // fy = fx / 2: rows stretched twice; the pixel at photo (3.5, 5.5) is at view
        // (3.5 + ox, 11 + oy), the same colour (bilinear between rows of one value).
        let v = k(30.0, 15.0, 6.0, 4.0).view(20, 10, None, u64::MAX).unwrap();
        assert_eq!(v.scale, (1.0, 2.0));
        let d = v.draw(&photo);
        let (x, y) = ((3.5 + v.offset.0 - 0.5).round() as u32, (11.0 + v.offset.1 - 0.5).floor() as u32);
        assert_eq!(d.get_pixel(x, y).0[0], photo.get_pixel(3, 5).0[0]);
    }

    #[test]
    fn a_principal_point_off_the_photo_and_a_huge_view_are_refused() {
        let e = k(30.0, 30.0, -2.0, 4.0).view(20, 10, None, u64::MAX).unwrap_err().to_string();
        assert!(e.contains("outside the 20x10 photo"), "{e}");
        let e = k(30.0, 30.0, 0.5, 4.0).view(20, 10, None, 100).unwrap_err().to_string();
        assert!(e.contains("over the limit of 100 pixels"), "{e}");
        assert!(Pinhole::new([0.0, 1.0, 1.0, 1.0]).is_err() && Pinhole::new([1.0, 1.0, f64::NAN, 1.0]).is_err());
    }

    #[test]
    fn a_centred_square_camera_is_the_models_own() {
        assert!(k(70.0, 70.0, 40.0, 30.0).is_centred(80, 60));
        assert!(!k(70.0, 70.0, 40.5, 30.0).is_centred(80, 60));
        assert!(!k(70.0, 70.1, 40.0, 30.0).is_centred(80, 60));
    }
}
