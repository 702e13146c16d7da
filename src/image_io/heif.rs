//! HEIC/HEIF (an iPhone's photos) and AVIF, decoded in this process by the system's libheif
//! (1.14 or newer, through `libheif-rs`; Debian and Ubuntu: libheif-dev), which reads HEVC
//! with libde265 and AV1 with dav1d or libaom. Built with the `heif` feature.
//!
//! As for JPEG: the file's own rotation and mirroring applied (`irot`, `imir`: HEIF readers
//! apply these and not an EXIF orientation), samples above 8 bits reduced to 8, alpha dropped,
//! a damaged file refused with the decoder's reason, and the size checked against the limit
//! before the pixels are decoded.

use anyhow::{anyhow, bail, Result};
use image::RgbImage;
use libheif_rs::{ColorSpace, HeifContext, ItemId, LibHeif, RgbChroma};

use super::{check_min_side, check_pixels, focal, DecodeOptions, Decoded, FovFrom, Source};

/// Decodes the primary image of a HEIF container (`kind`: "HEIC/HEIF" or "AVIF", for messages).
pub fn decode(bytes: &[u8], opts: &DecodeOptions, kind: &str) -> Result<(Decoded, Source)> {
    let damaged = |e: libheif_rs::HeifError| {
        let why = e.message.trim().to_owned();
        let lower = why.to_lowercase();
        if lower.contains("end of file") || lower.contains("end of data") || lower.contains("truncat") {
            anyhow!("truncated {kind}: {why} (the file has {} bytes)", bytes.len())
        } else {
            anyhow!("damaged {kind}: cannot decode ({why})")
        }
    };
    let ctx = HeifContext::read_from_bytes(bytes).map_err(damaged)?;
    let handle = ctx.primary_image_handle().map_err(damaged)?;
    check_pixels(handle.width(), handle.height(), opts.max_pixels)?;
    // libheif's defaults: the file's rotation and mirroring applied, wider samples converted
    // to the 8-bit RGB asked for. (libheif-rs 0.20 frees decoding options before libheif reads
    // them, so none are passed: `--no-exif` cannot keep the stored pixels of these files.)
    let image = LibHeif::new().decode(&handle, ColorSpace::Rgb(RgbChroma::Rgb), None).map_err(damaged)?;
    let (ow, oh) = (image.width(), image.height());
    check_min_side(ow, oh)?;
    let planes = image.planes();
    let plane = planes.interleaved.ok_or_else(|| anyhow!("damaged {kind}: no RGB plane after decoding"))?;
    let row = ow as usize * 3;
    if plane.stride < row || plane.data.len() < plane.stride * (oh as usize - 1) + row {
        bail!("damaged {kind}: the decoded plane is smaller than {ow}x{oh}");
    }
    let mut rgb = Vec::with_capacity(row * oh as usize);
    for y in 0..oh as usize {
        rgb.extend_from_slice(&plane.data[y * plane.stride..y * plane.stride + row]);
    }
    let rgb = RgbImage::from_raw(ow, oh, rgb).expect("sized");
    // The stored image turned a quarter by `irot` when the decoded one lies the other way (a
    // crop may have changed its size, not its orientation).
    let turned = (handle.ispe_width() > handle.ispe_height()) != (ow > oh) && ow != oh;
    let known = match opts.fov {
        // The tags describe the sensor as stored; `fov_x` turns them to the photo as shown.
        FovFrom::Exif => exif(&handle).map_or(Ok(None), |raw| focal::fov_x(&raw, if turned { (oh, ow) } else { (ow, oh) }, turned)),
        other => Ok(other.of_matrix(ow, oh)),
    };
    let (known_fov, exif_unreadable) = match known {
        Ok(fov) => (fov, None),
        Err(why) => (None, Some(why)),
    };
    let source = Source { format: None, oriented: turned, wide_samples: handle.luma_bits_per_pixel() > 8, damaged: false };
    Ok((Decoded { image: rgb, warning: None, known_fov, exif_unreadable }, source))
}

/// The photo's EXIF as a TIFF stream: HEIF stores it in an `Exif` item whose first 4 bytes
/// give the offset of the TIFF header after them.
fn exif(handle: &libheif_rs::ImageHandle) -> Option<Vec<u8>> {
    let mut ids: [ItemId; 1] = [0];
    if handle.metadata_block_ids(&mut ids, b"Exif") == 0 {
        return None;
    }
    let data = handle.metadata(ids[0]).ok()?;
    let skip = u32::from_be_bytes(data.get(..4)?.try_into().ok()?) as usize;
    data.get(4 + skip..).map(<[u8]>::to_vec)
}
