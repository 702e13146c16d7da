//! Reading photos the way the upstream CLI does (`cv2.imread` + BGR→RGB): 8-bit RGB, gray
//! replicated to three channels, alpha dropped (not composited), 16-bit reduced by keeping the
//! high byte, EXIF orientation applied.

pub mod focal;
#[cfg(feature = "heif")]
mod heif;
mod integrity;
pub mod video;

pub use focal::KnownFov;

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use image::{DynamicImage, ImageDecoder, ImageReader, RgbImage};

/// Smallest side accepted: below this the token grid and the 64x64 focal sampling degenerate.
pub const MIN_SIDE: u32 = 8;
/// Largest image accepted by default, in pixels: a header may claim any size, and a
/// 1.3-gigapixel image would need >15 GB of outputs (`--max-megapixels` raises it).
pub const MAX_PIXELS: u64 = 250_000_000;

/// Whether `width` x `height` is a size the model's images may have ([`MIN_SIDE`] and
/// [`MAX_PIXELS`]): a canvas, or a test picture made to size.
pub fn is_supported_size(width: u32, height: u32) -> bool {
    width >= MIN_SIDE && height >= MIN_SIDE && width as u64 * height as u64 <= MAX_PIXELS
}

/// How photos are read.
#[derive(Debug, Clone)]
pub struct DecodeOptions {
    /// Apply the EXIF orientation.
    pub apply_exif: bool,
    /// Refuse images with more pixels than this, before decoding them.
    pub max_pixels: u64,
    /// Decode truncated files as far as the decoder goes (a warning instead of an error).
    pub allow_truncated: bool,
    /// Where each photo's field of view is known from, beside the model's estimate.
    pub fov: FovFrom,
}

/// Where a photo's horizontal field of view is known from.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum FovFrom {
    /// Nowhere: the model estimates it (or `--fov-x DEG` gives one for every photo).
    #[default]
    Estimate,
    /// The photo's EXIF focal length (`--fov-x exif`).
    Exif,
    /// A camera matrix in pixels (`--intrinsics`, or the photo's row of a table), used whole.
    Intrinsics(crate::camera::Pinhole),
    /// The field of view of the photo's folder or video, in degrees (`--camera shared`).
    Shared(f32),
}

impl FovFrom {
    /// The field of view of a camera matrix for an image of `width` x `height` as shown, with
    /// the camera; `None` for the other sources (the EXIF is read with the file).
    pub fn of_matrix(&self, width: u32, height: u32) -> Option<KnownFov> {
        match self {
            FovFrom::Intrinsics(camera) => focal::from_camera(camera, (width, height)),
            FovFrom::Shared(degrees) => {
                Some(KnownFov { degrees: *degrees, from: "shared: the median of its folder's or video's first pass".into(), camera: None })
            }
            _ => None,
        }
    }
}

/// Refuses an image of more pixels than `max` before any of it is decoded.
fn check_pixels(w: u32, h: u32, max: u64) -> Result<()> {
    let pixels = w as u64 * h as u64;
    if pixels > max {
        bail!("image is {w}x{h} ({:.1} megapixels), over the limit of {} megapixels (--max-megapixels raises it)", pixels as f64 / 1e6, max as f64 / 1e6);
    }
    Ok(())
}

/// Refuses an image too small for the model.
fn check_min_side(w: u32, h: u32) -> Result<()> {
    if w < MIN_SIDE || h < MIN_SIDE {
        bail!("image is {w}x{h}, smaller than the minimum {MIN_SIDE}x{MIN_SIDE}");
    }
    Ok(())
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self { apply_exif: true, max_pixels: MAX_PIXELS, allow_truncated: false, fov: FovFrom::Estimate }
    }
}

/// A decoded photo, and what was wrong with the file when that was let through.
#[derive(Debug)]
pub struct Decoded {
    pub image: RgbImage,
    pub warning: Option<String>,
    /// The field of view from the EXIF focal length, when asked for and there.
    pub known_fov: Option<KnownFov>,
    /// Why the EXIF asked for could not be read at all (`--fov-x exif`).
    pub exif_unreadable: Option<String>,
}

/// What the file held beyond its pixels: whether another decoder given the same bytes (a
/// server's) would see the image this crate decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The format as the `image` crate knows it; `None` for HEIC/HEIF and AVIF (libheif's).
    pub format: Option<image::ImageFormat>,
    /// The file carries an EXIF orientation other than "as stored", whether it was applied
    /// here or not (another reader may decide otherwise).
    pub oriented: bool,
    /// Samples wider than 8 bits (16-bit PNG or TIFF, float), reduced here to 8 bits; other
    /// readers reduce them differently.
    pub wide_samples: bool,
    /// The file is damaged and was decoded anyway (`allow_truncated`).
    pub damaged: bool,
}

/// A photo read from disk: its pixels, what the file was, and the file's bytes.
#[derive(Debug)]
pub struct Loaded {
    pub decoded: Decoded,
    pub source: Source,
    pub bytes: Vec<u8>,
}

/// Decodes `path` into 8-bit RGB. Errors name the file and the reason.
pub fn load_rgb(path: &Path, apply_exif: bool) -> Result<RgbImage> {
    Ok(load_rgb_with(path, &DecodeOptions { apply_exif, ..Default::default() })?.image)
}

/// [`load_rgb`] with every option.
pub fn load_rgb_with(path: &Path, opts: &DecodeOptions) -> Result<Decoded> {
    Ok(load_with_source(path, opts)?.decoded)
}

/// [`load_rgb_with`] that also returns the file's bytes and what they held (to send the file
/// to a server as it is where that server would decode it alike).
pub fn load_with_source(path: &Path, opts: &DecodeOptions) -> Result<Loaded> {
    read_and_decode(path, opts).with_context(|| format!("{}", path.display()))
}

fn read_and_decode(path: &Path, opts: &DecodeOptions) -> Result<Loaded> {
    let meta = std::fs::metadata(path).context("cannot open")?;
    if meta.is_dir() {
        bail!("is a directory, not an image");
    }
    if meta.len() == 0 {
        bail!("empty file");
    }
    // Whole, so that the structure can be checked before decoding (photos are a few MB).
    let bytes = std::fs::read(path).context("cannot read")?;
    let (decoded, source) = decode_bytes_with_source(&bytes, opts)?;
    Ok(Loaded { decoded, source, bytes })
}

/// Decodes an image file held in memory: the format from its first bytes, the file checked
/// whole, the size checked against the limit before any pixel is decoded.
pub fn decode_bytes(bytes: &[u8], opts: &DecodeOptions) -> Result<Decoded> {
    Ok(decode_bytes_with_source(bytes, opts)?.0)
}

/// [`decode_bytes`], and what the file held beyond its pixels.
pub fn decode_bytes_with_source(bytes: &[u8], opts: &DecodeOptions) -> Result<(Decoded, Source)> {
    if bytes.is_empty() {
        bail!("empty file");
    }
    if let Some(kind) = heif_container(bytes) {
        #[cfg(feature = "heif")]
        return heif::decode(bytes, opts, kind);
        #[cfg(not(feature = "heif"))]
        bail!(
            "a {kind} photo, which this build of moge does not decode: build it with `--features heif` (needs libheif-dev 1.14 or \
             newer), or convert the photo first, e.g. `heif-convert IN OUT.jpg` (Debian and Ubuntu: package libheif-examples)"
        );
    }
    let reader = ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format().context("cannot read")?;
    let Some(format) = reader.format() else { bail!("not an image (unrecognised format)") };
    let name = match format {
        image::ImageFormat::Jpeg => "JPEG".to_owned(),
        image::ImageFormat::WebP => "WebP".to_owned(),
        other => other.extensions_str().first().map(|e| e.to_uppercase()).unwrap_or_else(|| format!("{other:?}")),
    };
    let warning = match integrity::check(format, bytes) {
        Ok(()) => None,
        Err(why) if opts.allow_truncated => Some(format!("{why}; decoded anyway (--allow-truncated), missing parts filled in")),
        Err(why) => bail!("{why}"),
    };
    let mut limits = image::Limits::default();
    // 16-bit RGBA at the pixel limit, and the decoders' working buffers.
    limits.max_alloc = Some(opts.max_pixels.saturating_mul(8).max(64 << 20));
    let mut decoder = {
        let mut r = reader;
        r.limits(limits);
        r.into_decoder().map_err(|e| decode_error(e, &name, bytes.len()))?
    };
    let (w, h) = decoder.dimensions();
    check_pixels(w, h, opts.max_pixels)?;
    // The decoder allocates the whole image at once, and an allocation that fails aborts the
    // process: ask first, so that a size beyond this machine is an error for this file only.
    let need = decoder.total_bytes();
    let mut probe: Vec<u8> = Vec::new();
    if usize::try_from(need).map_or(true, |n| probe.try_reserve_exact(n).is_err()) {
        bail!("image is {w}x{h}: decoding it needs {:.1} GB, more memory than can be had", need as f64 / 1e9);
    }
    drop(probe);
    // Read even when it is not applied: the file still carries it for another reader.
    let orientation = decoder.orientation().ok().filter(|&o| o != image::metadata::Orientation::NoTransforms);
    let wide_samples = decoder.color_type().bytes_per_pixel() > decoder.color_type().channel_count();
    let known_fov = match opts.fov {
        FovFrom::Exif => {
            use image::metadata::Orientation as O;
            let turned = opts.apply_exif && matches!(orientation, Some(O::Rotate90 | O::Rotate270 | O::Rotate90FlipH | O::Rotate270FlipH));
            match decoder.exif_metadata() {
                Ok(Some(raw)) => focal::fov_x(&raw, (w, h), turned),
                Ok(None) => Ok(None),
                Err(e) => Err(e.to_string()),
            }
        }
        _ => Ok(None),
    };
    let (known_fov, exif_unreadable) = match known_fov {
        Ok(fov) => (fov, None),
        Err(why) => (None, Some(why)),
    };
    let mut img = DynamicImage::from_decoder(decoder).map_err(|e| decode_error(e, &name, bytes.len()))?;
    if let Some(o) = orientation.filter(|_| opts.apply_exif) {
        img.apply_orientation(o);
    }
    let rgb = to_rgb8(img);
    check_min_side(rgb.width(), rgb.height())?;
    let known_fov = known_fov.or_else(|| opts.fov.of_matrix(rgb.width(), rgb.height()));
    let source = Source { format: Some(format), oriented: orientation.is_some(), wide_samples, damaged: warning.is_some() };
    Ok((Decoded { image: rgb, warning, known_fov, exif_unreadable }, source))
}

/// An image decoded elsewhere (a video's frame) as a decoded photo: the size checked and the
/// field of view of `--intrinsics` applied (a frame has no EXIF).
pub fn from_pixels(image: RgbImage, opts: &DecodeOptions) -> Result<Decoded> {
    let (w, h) = image.dimensions();
    check_pixels(w, h, opts.max_pixels)?;
    check_min_side(w, h)?;
    Ok(Decoded { known_fov: opts.fov.of_matrix(w, h), image, warning: None, exif_unreadable: None })
}

/// `HEIC/HEIF` or `AVIF` for a file in those ISO base media containers (an `ftyp` box first,
/// by its major or a compatible brand).
fn heif_container(bytes: &[u8]) -> Option<&'static str> {
    if bytes.len() < 16 || &bytes[4..8] != b"ftyp" {
        return None;
    }
    let size = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let end = size.clamp(16, bytes.len());
    // The major brand, then the compatible brands after the minor version.
    let brands = std::iter::once(&bytes[8..12]).chain(bytes[16..end].chunks_exact(4));
    let mut kind = None;
    for b in brands {
        match b {
            b"avif" | b"avis" => return Some("AVIF"),
            b"heic" | b"heix" | b"hevc" | b"hevx" | b"heim" | b"heis" | b"hevm" | b"hevs" | b"mif1" | b"msf1" => kind = Some("HEIC/HEIF"),
            _ => {}
        }
    }
    kind
}

/// A decoder's error in words: running out of bytes is a truncated file.
fn decode_error(e: image::ImageError, format: &str, len: usize) -> anyhow::Error {
    use image::ImageError as E;
    let eof = match &e {
        E::IoError(io) => io.kind() == std::io::ErrorKind::UnexpectedEof,
        E::Decoding(d) => {
            let s = d.to_string().to_lowercase();
            s.contains("end of file") || s.contains("eof") || s.contains("fill whole buffer")
        }
        _ => false,
    };
    match &e {
        _ if eof => anyhow!("truncated {format}: image data ends at byte {len} ({e})"),
        E::Limits(_) => anyhow!("cannot decode: {e} (the image needs more memory than the --max-megapixels limit allows)"),
        E::Unsupported(_) => anyhow!("cannot decode: unsupported {format} variant ({e})"),
        _ => anyhow!("damaged {format}: cannot decode ({e})"),
    }
}

/// 8-bit RGB with OpenCV's conversions: 16-bit samples keep their high byte, float samples
/// are scaled by 255 and saturated, alpha is ignored.
pub fn to_rgb8(img: DynamicImage) -> RgbImage {
    use DynamicImage as D;
    let (w, h) = (img.width(), img.height());
    let from16 = |src: &[u16], ch: usize, gray: bool| -> RgbImage {
        let mut out = Vec::with_capacity(w as usize * h as usize * 3);
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
