//! A photo's horizontal field of view (as shown, after its orientation) from what is known of its
//! camera: its EXIF focal length (`--fov-x exif`) or a camera matrix (`--intrinsics`, a table).
//!
//! `FocalLengthIn35mmFilm` first: the focal length that gives a 36 x 24 mm frame the photo's
//! diagonal field of view (the CIPA definition, whatever the sensor's aspect). Else
//! `FocalLength` in mm with `FocalPlaneXResolution` (pixels per `FocalPlaneResolutionUnit`) for
//! the pixels of `PixelXDimension` (or of the image as stored): the focal length in pixels, for
//! square pixels.

use ::exif::{In, Reader, Tag, Value};

use crate::camera::Pinhole;

/// The diagonal of a 36 x 24 mm frame, in mm.
const FULL_FRAME_DIAGONAL: f64 = 43.266_615_305_567_87;

/// A photo's field of view known beside the model (EXIF, or a camera matrix), and where from.
#[derive(Debug, Clone, PartialEq)]
pub struct KnownFov {
    /// Horizontal, in degrees, of the photo as shown.
    pub degrees: f32,
    /// The tags it came from, with their values (for the sidecar).
    pub from: String,
    /// The whole camera matrix, where one was given (`--intrinsics`, a table of cameras).
    pub camera: Option<Pinhole>,
}

fn number(exif: &::exif::Exif, tag: Tag) -> Option<f64> {
    let field = exif.get_field(tag, In::PRIMARY)?;
    let v = match &field.value {
        Value::Rational(r) => r.first().filter(|r| r.denom != 0).map(|r| r.to_f64()),
        Value::Short(v) => v.first().map(|&v| v as f64),
        Value::Long(v) => v.first().map(|&v| v as f64),
        _ => None,
    }?;
    (v.is_finite() && v > 0.0).then_some(v)
}

/// The horizontal field of view of the photo whose raw EXIF block is `raw`, stored as
/// `stored` (width, height) and shown rotated by a quarter turn when `quarter_turn`; `None`
/// where the EXIF gives no focal length this can use, an error (the reason) where the EXIF
/// cannot be read at all.
pub fn fov_x(raw: &[u8], stored: (u32, u32), quarter_turn: bool) -> Result<Option<KnownFov>, String> {
    Ok(fov_of(&read_lenient(raw)?, stored, quarter_turn))
}

/// The EXIF's entries that are whole. Writers lay EXIF out loosely: piexif ends the Exif IFD
/// without the next-IFD offset that the TIFF layout asks for (PIL and exiftool read past it),
/// so a damaged part costs only its own entries.
fn read_lenient(raw: &[u8]) -> Result<::exif::Exif, String> {
    match Reader::new().continue_on_error(true).read_raw(raw.to_vec()) {
        Ok(exif) => Ok(exif),
        Err(::exif::Error::PartialResult(partial)) => {
            let (exif, errors) = partial.into_inner();
            match errors.first() {
                Some(e) if exif.fields().next().is_none() => Err(e.to_string()),
                _ => Ok(exif),
            }
        }
        Err(e) => Err(e.to_string()),
    }
}

fn fov_of(exif: &::exif::Exif, stored: (u32, u32), quarter_turn: bool) -> Option<KnownFov> {
    let (sw, sh) = (stored.0 as f64, stored.1 as f64);
    let (w, h) = if quarter_turn { (sh, sw) } else { (sw, sh) };
    if let Some(f35) = number(exif, Tag::FocalLengthIn35mmFilm) {
        let half_diagonal = FULL_FRAME_DIAGONAL / (2.0 * f35);
        let fov = degrees(half_diagonal * w / w.hypot(h));
        return finite(fov, format!("FocalLengthIn35mmFilm {f35} mm"));
    }
    let focal_mm = number(exif, Tag::FocalLength)?;
    let per_unit = number(exif, Tag::FocalPlaneXResolution)?;
    let unit_mm = match number(exif, Tag::FocalPlaneResolutionUnit).unwrap_or(2.0) as u32 {
        2 => 25.4,
        3 => 10.0,
        4 => 1.0,
        5 => 0.001,
        _ => return None,
    };
    // The resolution is of the sensor's pixels, which PixelXDimension counts; a photo scaled
    // down after it was taken keeps its EXIF.
    let sensor_width = number(exif, Tag::PixelXDimension).unwrap_or(sw);
    let focal_px = focal_mm * per_unit / unit_mm * (sw / sensor_width);
    let fov = degrees(w / (2.0 * focal_px));
    finite(fov, format!("FocalLength {focal_mm} mm at FocalPlaneXResolution {per_unit} per {unit_mm} mm"))
}

/// The horizontal field of view of a photo of `size` (as shown) taken by `camera`; the camera
/// goes with it, to be used whole (see [`crate::camera`]).
pub fn from_camera(camera: &Pinhole, size: (u32, u32)) -> Option<KnownFov> {
    let mut fov = finite(camera.fov_x(size.0), format!("intrinsics {camera}"))?;
    fov.camera = Some(*camera);
    Some(fov)
}

/// The full angle, in degrees, whose half has tangent `half_tan`.
fn degrees(half_tan: f64) -> f64 {
    (2.0 * half_tan.atan()).to_degrees()
}

fn finite(fov: f64, from: String) -> Option<KnownFov> {
    // The model takes a field of view strictly between 0 and 180 degrees.
    (fov.is_finite() && fov > 0.0 && fov < 179.0).then_some(KnownFov { degrees: fov as f32, from, camera: None })
}
