//! PNG files made by hand: a header that claims a size, an EXIF chunk in an encoded file.

/// One chunk: the data's length, the type, the data, and the CRC-32 of type and data.
pub fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut typed = kind.to_vec();
    typed.extend_from_slice(data);
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&typed);
    out.extend(crc32(&typed).to_be_bytes());
    out
}

/// CRC-32 (IEEE 802.3, reflected), as PNG computes it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}
