//! What is sent to a server for a photo.

use std::borrow::Cow;

use anyhow::{Context, Result};
use image::RgbImage;

use crate::image_io::Source;

/// What to send for a photo: the file itself where the server decodes it to the same pixels
/// (a JPEG or PNG of 8-bit samples, whole, with no EXIF orientation), else the pixels decoded
/// here (orientation applied or not as asked) as a fast-compressed PNG.
pub fn image_for_server<'a>(bytes: &'a [u8], source: &Source, image: &RgbImage) -> Result<Cow<'a, [u8]>> {
    let plain = matches!(source.format, Some(image::ImageFormat::Jpeg | image::ImageFormat::Png));
    if plain && !source.oriented && !source.wide_samples && !source.damaged {
        return Ok(Cow::Borrowed(bytes));
    }
    png_for_server(image).map(Cow::Owned)
}

/// Pixels as a fast-compressed PNG, which every server decodes to the same samples.
pub fn png_for_server(image: &RgbImage) -> Result<Vec<u8>> {
    use image::codecs::png::{CompressionType, FilterType, PngEncoder};
    use image::ImageEncoder;
    let mut out = Vec::with_capacity(image.as_raw().len() / 2);
    PngEncoder::new_with_quality(&mut out, CompressionType::Fast, FilterType::Adaptive)
        .write_image(image.as_raw(), image.width(), image.height(), image::ExtendedColorType::Rgb8)
        .context("cannot encode the image as PNG for the server")?;
    Ok(out)
}
