//! OpenCV's `cv2.remap` with float32 maps, as upstream's panorama code calls it
//! (`moge/utils/panorama.py`), reproduced number for number: OpenCV 4.10's `imgwarp.cpp` rounds
//! each coordinate to 1/32 of a pixel (`INTER_BITS` = 5) and takes the bilinear weights of that
//! 32 x 32 table: in float for float images, in 15-bit fixed point for 8-bit ones. Nearest
//! rounds the coordinate half to even. Maps are row-major, one coordinate per output pixel.

const BITS: i32 = 5;
const TAB: i32 = 1 << BITS;

/// OpenCV's `saturate_cast<int>(float)`: round half to even, saturating.
fn round_even(v: f32) -> i32 {
    v.round_ties_even() as i32
}

/// The source cell (x0, y0) and the table cell (ax, ay) in 32nds of a pixel.
fn fixed(x: f32, y: f32) -> (i32, i32, i32, i32) {
    let (fx, fy) = (round_even(x * TAB as f32), round_even(y * TAB as f32));
    (fx >> BITS, fy >> BITS, fx & (TAB - 1), fy & (TAB - 1))
}

/// The four float weights of table cell (ax, ay): (top-left, top-right, bottom-left, bottom-right).
fn weights(ax: i32, ay: i32) -> [f32; 4] {
    let (wx1, wy1) = (ax as f32 / TAB as f32, ay as f32 / TAB as f32);
    let (wx0, wy0) = (1.0 - wx1, 1.0 - wy1);
    [wy0 * wx0, wy0 * wx1, wy1 * wx0, wy1 * wx1]
}

/// `cv2.remap(src, mx, my, cv2.INTER_LINEAR)` of an 8-bit RGB image (`BORDER_CONSTANT` 0):
/// taps outside the image read 0.
pub fn rgb8_linear(src: &[u8], w: usize, h: usize, mx: &[f32], my: &[f32]) -> Vec<u8> {
    assert_eq!(src.len(), 3 * w * h);
    assert_eq!(mx.len(), my.len());
    let mut out = vec![0u8; 3 * mx.len()];
    for (i, (&x, &y)) in mx.iter().zip(my).enumerate() {
        let (x0, y0, ax, ay) = fixed(x, y);
        // The fixed-point weights sum to 2^15 exactly: (32 - a)(32 - b) * 32 and its kin.
        let wt = weights(ax, ay).map(|v| (v * 32768.0) as i32);
        let taps = [(x0, y0), (x0 + 1, y0), (x0, y0 + 1), (x0 + 1, y0 + 1)];
        for c in 0..3 {
            let mut sum = 0i32;
            for (&(tx, ty), &wk) in taps.iter().zip(&wt) {
                if tx >= 0 && ty >= 0 && (tx as usize) < w && (ty as usize) < h {
                    sum += src[3 * (ty as usize * w + tx as usize) + c] as i32 * wk;
                }
            }
            out[3 * i + c] = ((sum + (1 << 14)) >> 15).clamp(0, 255) as u8;
        }
    }
    out
}

/// `cv2.remap(src, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)` of a float
/// plane: taps outside read the nearest edge pixel.
pub fn f32_linear_replicate(src: &[f32], w: usize, h: usize, mx: &[f32], my: &[f32]) -> Vec<f32> {
    assert_eq!(src.len(), w * h);
    mx.iter().zip(my).map(|(&x, &y)| f32_linear_at(src, w, h, x, y)).collect()
}

/// One value of [`f32_linear_replicate`].
pub fn f32_linear_at(src: &[f32], w: usize, h: usize, x: f32, y: f32) -> f32 {
    let (x0, y0, ax, ay) = fixed(x, y);
    let cx = |v: i32| v.clamp(0, w as i32 - 1) as usize;
    let cy = |v: i32| v.clamp(0, h as i32 - 1) as usize;
    let (xa, xb, ya, yb) = (cx(x0), cx(x0 + 1), cy(y0), cy(y0 + 1));
    let wt = weights(ax, ay);
    src[ya * w + xa] * wt[0] + src[ya * w + xb] * wt[1] + src[yb * w + xa] * wt[2] + src[yb * w + xb] * wt[3]
}

/// `cv2.remap(src, mx, my, cv2.INTER_NEAREST, borderMode=cv2.BORDER_REPLICATE)` of one
/// 8-bit plane, one value at (`x`, `y`).
pub fn u8_nearest_replicate_at(src: &[u8], w: usize, h: usize, x: f32, y: f32) -> u8 {
    let xi = round_even(x).clamp(0, w as i32 - 1) as usize;
    let yi = round_even(y).clamp(0, h as i32 - 1) as usize;
    src[yi * w + xi]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_round_to_32nds_half_to_even() {
        // 1/64 is half a 32nd: it rounds to 0 (even), 3/64 to 2/32.
        assert_eq!(fixed(1.0 / 64.0, 3.0 / 64.0), (0, 0, 0, 2));
        assert_eq!(fixed(-0.5, 2.5), (-1, 2, 16, 16));
        assert_eq!(weights(16, 0), [0.5, 0.5, 0.0, 0.0]);
    }

    #[test]
    fn a_map_of_whole_pixels_copies_and_the_border_reads_as_the_rules_say() {
        let src: Vec<f32> = (0..12).map(|v| v as f32).collect(); // 4 x 3
        assert_eq!(f32_linear_at(&src, 4, 3, 2.0, 1.0), 6.0);
        assert_eq!(f32_linear_at(&src, 4, 3, -3.0, 9.0), 8.0); // replicate: (0, 2)
        let rgb = vec![200u8; 3 * 4 * 3];
        // Half a pixel left of the image: half the taps read the constant 0.
        assert_eq!(rgb8_linear(&rgb, 4, 3, &[-0.5], &[1.0]), vec![100, 100, 100]);
        let m: Vec<u8> = (0..12).collect();
        assert_eq!(u8_nearest_replicate_at(&m, 4, 3, 2.5, 0.5), 2); // both halves to even
    }
}
