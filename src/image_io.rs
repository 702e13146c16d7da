//! Reading photos the way the upstream CLI does (`cv2.imread` + BGR→RGB): 8-bit RGB, gray
//! replicated to three channels, alpha dropped (not composited), 16-bit reduced by keeping the
//! high byte, EXIF orientation applied.

use std::path::Path;

use anyhow::{bail, Context, Result};
use image::{DynamicImage, ImageDecoder, ImageReader, RgbImage};

/// Smallest side accepted: below this the token grid and the 64x64 focal sampling degenerate.
pub const MIN_SIDE: u32 = 8;
/// Largest image accepted, in pixels (a 1.3-gigapixel image would need >15 GB of outputs).
pub const MAX_PIXELS: u64 = 256 * 1024 * 1024;

/// Decodes `path` into 8-bit RGB. Errors name the file and the reason.
pub fn load_rgb(path: &Path, apply_exif: bool) -> Result<RgbImage> {
    decode(path, apply_exif).with_context(|| format!("{}", path.display()))
}

fn decode(path: &Path, apply_exif: bool) -> Result<RgbImage> {
    let meta = std::fs::metadata(path).context("cannot open")?;
    if meta.is_dir() {
        bail!("is a directory, not an image");
    }
    if meta.len() == 0 {
        bail!("empty file");
    }
    let reader = ImageReader::open(path).context("cannot open")?.with_guessed_format().context("cannot read")?;
    if reader.format().is_none() {
        bail!("not an image (unrecognised format)");
    }
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(4 * MAX_PIXELS * 4);
    let mut decoder = {
        let mut r = reader;
        r.limits(limits);
        r.into_decoder().context("cannot decode")?
    };
    let (w, h) = decoder.dimensions();
    if (w as u64) * (h as u64) > MAX_PIXELS {
        bail!("image is {w}x{h}, over the limit of {MAX_PIXELS} pixels");
    }
    let orientation = if apply_exif { decoder.orientation().ok() } else { None };
    let mut img = DynamicImage::from_decoder(decoder).context("cannot decode (corrupt or truncated?)")?;
    if let Some(o) = orientation {
        img.apply_orientation(o);
    }
    let rgb = to_rgb8(img);
    if rgb.width() < MIN_SIDE || rgb.height() < MIN_SIDE {
        bail!("image is {}x{}, smaller than the minimum {MIN_SIDE}x{MIN_SIDE}", rgb.width(), rgb.height());
    }
    Ok(rgb)
}

/// 8-bit RGB with OpenCV's conversions: 16-bit samples keep their high byte, float samples
/// are scaled by 255 and saturated, alpha is ignored.
pub fn to_rgb8(img: DynamicImage) -> RgbImage {
    use DynamicImage as D;
    let (w, h) = (img.width(), img.height());
    let from16 = |src: &[u16], ch: usize, gray: bool| -> RgbImage {
        let mut out = Vec::with_capacity((w * h * 3) as usize);
        for px in src.chunks_exact(ch) {
            if gray {
                let v = (px[0] >> 8) as u8;
                out.extend_from_slice(&[v, v, v]);
            } else {
                out.extend_from_slice(&[(px[0] >> 8) as u8, (px[1] >> 8) as u8, (px[2] >> 8) as u8]);
            }
        }
        RgbImage::from_raw(w, h, out).expect("buffer size matches")
    };
    match img {
        D::ImageRgb8(i) => i,
        D::ImageLuma16(i) => from16(i.as_raw(), 1, true),
        D::ImageLumaA16(i) => from16(i.as_raw(), 2, true),
        D::ImageRgb16(i) => from16(i.as_raw(), 3, false),
        D::ImageRgba16(i) => from16(i.as_raw(), 4, false),
        // 8-bit gray, gray+alpha, RGBA, float: the crate's conversion replicates gray and
        // drops alpha without compositing, as OpenCV does.
        other => other.to_rgb8(),
    }
}
