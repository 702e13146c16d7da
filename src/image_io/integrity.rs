//! Is the file whole? JPEG, PNG and WebP decoders fill in what a truncated file lacks (zune-jpeg
//! pads missing scan data; png and image-webp stop early without a word when only the trailer is
//! cut), so a photo cut short by an interrupted copy would be processed as grey or half an image.
//! These checks walk the container structure, which costs a scan of the bytes and
//! no decoding, and name where the data ends.

use memchr::memchr;

/// `Err(reason)` when `bytes` (a file of the named format) is cut short.
pub fn check(format: image::ImageFormat, bytes: &[u8]) -> Result<(), String> {
    match format {
        image::ImageFormat::Jpeg => jpeg(bytes),
        image::ImageFormat::Png => png(bytes),
        image::ImageFormat::WebP => webp(bytes),
        _ => Ok(()),
    }
}

/// Walks the markers: segments by their lengths, entropy-coded data up to the next marker that
/// is not a stuffed 0xFF00 or a restart, until the end-of-image marker (EOI).
fn jpeg(b: &[u8]) -> Result<(), String> {
    let n = b.len();
    if n < 2 || b[0] != 0xFF || b[1] != 0xD8 {
        return Err("damaged JPEG: no start-of-image marker".into());
    }
    let mut pos = 2;
    let mut seen_scan = false;
    let cut = |seen_scan: bool| {
        if seen_scan {
            format!("truncated JPEG: image data ends at byte {n} without the end-of-image marker")
        } else {
            format!("truncated JPEG: the file ends at byte {n} before its image data")
        }
    };
    loop {
        // A marker: 0xFF, any fill bytes 0xFF, then the code.
        if pos >= n {
            return Err(cut(seen_scan));
        }
        if b[pos] != 0xFF {
            // Stray bytes between segments: skipped, as libjpeg's next_marker does.
            match memchr(0xFF, &b[pos..]) {
                Some(i) => pos += i,
                None => return Err(cut(seen_scan)),
            }
        }
        while pos < n && b[pos] == 0xFF {
            pos += 1;
        }
        if pos >= n {
            return Err(cut(seen_scan));
        }
        let code = b[pos];
        pos += 1;
        match code {
            0xD9 => return Ok(()),
            0xD0..=0xD7 | 0x01 => continue,
            0x00 => return Err(format!("damaged JPEG: stray 0xFF00 at byte {}", pos - 2)),
            _ => {}
        }
        if pos + 2 > n {
            return Err(cut(seen_scan));
        }
        let len = u16::from_be_bytes([b[pos], b[pos + 1]]) as usize;
        if len < 2 {
            return Err(format!("damaged JPEG: segment 0xFF{code:02X} at byte {} has length {len}", pos - 2));
        }
        pos += len;
        if pos > n {
            return Err(cut(seen_scan));
        }
        if code == 0xDA {
            seen_scan = true;
            // Entropy-coded data: runs to the first 0xFF not followed by 0x00 or a restart.
            loop {
                match memchr(0xFF, &b[pos..]) {
                    None => return Err(cut(true)),
                    Some(i) => {
                        let at = pos + i;
                        match b.get(at + 1) {
                            None => return Err(cut(true)),
                            Some(0x00) | Some(0xD0..=0xD7) => pos = at + 2,
                            Some(0xFF) => pos = at + 1,
                            Some(_) => {
                                pos = at;
                                break;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Walks the chunks by their lengths up to IEND.
fn png(b: &[u8]) -> Result<(), String> {
    const SIG: &[u8] = b"\x89PNG\r\n\x1a\n";
    let n = b.len();
    if !b.starts_with(SIG) {
        return Err("damaged PNG: no PNG signature".into());
    }
    let mut pos = SIG.len();
    let mut seen_data = false;
    loop {
        if pos + 8 > n {
            break;
        }
        let len = u32::from_be_bytes(b[pos..pos + 4].try_into().unwrap()) as usize;
        let kind = &b[pos + 4..pos + 8];
        seen_data |= kind == b"IDAT";
        let end = pos.saturating_add(12).saturating_add(len);
        if end > n {
            break;
        }
        if kind == b"IEND" {
            return Ok(());
        }
        pos = end;
    }
    Err(if seen_data {
        format!("truncated PNG: image data ends at byte {n} without the IEND chunk")
    } else {
        format!("truncated PNG: the file ends at byte {n} before its image data")
    })
}

/// The RIFF header states the file's length.
fn webp(b: &[u8]) -> Result<(), String> {
    if b.len() < 12 || &b[..4] != b"RIFF" || &b[8..12] != b"WEBP" {
        return Err("damaged WebP: no RIFF/WEBP header".into());
    }
    let want = u32::from_le_bytes(b[4..8].try_into().unwrap()) as u64 + 8;
    if (b.len() as u64) < want {
        return Err(format!("truncated WebP: image data ends at byte {}, the header says {want}", b.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(format: image::ImageFormat) -> Vec<u8> {
        let img = image::RgbImage::from_fn(64, 48, |x, y| image::Rgb([(x * 4) as u8, (y * 5) as u8, ((x ^ y) * 3) as u8]));
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    #[test]
    fn whole_files_pass_and_every_cut_is_caught() {
        for format in [image::ImageFormat::Jpeg, image::ImageFormat::Png, image::ImageFormat::WebP] {
            let b = encoded(format);
            assert_eq!(check(format, &b), Ok(()), "{format:?}");
            // Trailing bytes after the end are allowed (cameras append data after EOI).
            let mut longer = b.clone();
            longer.extend_from_slice(b"trailing");
            assert_eq!(check(format, &longer), Ok(()), "{format:?}");
            for cut in 1..b.len() {
                let e = check(format, &b[..cut]).expect_err(&format!("{format:?} cut at {cut}"));
                assert!(e.starts_with("truncated") || e.starts_with("damaged"), "{e}");
            }
        }
    }

    #[test]
    fn stray_bytes_between_jpeg_segments_are_skipped_as_libjpeg_does() {
        let b = encoded(image::ImageFormat::Jpeg);
        // After APP0 (or the first segment): 5 zero bytes.
        let seg_end = 4 + u16::from_be_bytes([b[4], b[5]]) as usize;
        let mut odd = b[..seg_end].to_vec();
        odd.extend_from_slice(&[0; 5]);
        odd.extend_from_slice(&b[seg_end..]);
        assert_eq!(check(image::ImageFormat::Jpeg, &odd), Ok(()));
    }

    #[test]
    fn the_jpeg_message_names_where_the_data_ends() {
        let b = encoded(image::ImageFormat::Jpeg);
        let e = check(image::ImageFormat::Jpeg, &b[..b.len() - 100]).unwrap_err();
        assert_eq!(e, format!("truncated JPEG: image data ends at byte {} without the end-of-image marker", b.len() - 100));
        let e = check(image::ImageFormat::Jpeg, &b[..20]).unwrap_err();
        assert!(e.contains("before its image data"), "{e}");
    }
}
