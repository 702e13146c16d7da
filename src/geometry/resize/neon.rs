//! The resizes' NEON routes (aarch64), the twins of `avx2.rs`'s on vectors of four.
//!
//! `lerp_taps`: where four consecutive output columns read source values within eight
//! consecutive floats (an upsampling, as the post-processing's is), two loads and two table
//! lookups over both registers (`tbl`) fetch their taps instead of eight single-lane loads. The
//! arithmetic is the portable loop's (a·wa + b·wb, two products and a sum, no FMA), so the bits
//! are the same; other blocks take that loop.
//!
//! `rows_to_lanes` / `lanes_to_rows`: eight rows as columns of eight lanes and back, by 4x4
//! transposes in registers (the antialiased downscale's x pass works on such columns).
//!
//! Every aarch64 CPU has NEON: these run at every Arm level but `portable`.

use core::arch::aarch64::*;

/// out[i] = src[x0[i]]·w0[i] + src[x1[i]]·w1[i] (indices clamped to the row, as the portable
/// loop does).
///
/// # Safety
/// None beyond NEON, which every aarch64 CPU has: every read and write stays inside the
/// slices, whatever they hold.
#[target_feature(enable = "neon")]
pub(super) unsafe fn lerp_taps(src: &[f32], x0: &[u32], x1: &[u32], w0: &[f32], w1: &[f32], out: &mut [f32]) {
    let n = out.len().min(x0.len()).min(x1.len()).min(w0.len()).min(w1.len());
    if src.is_empty() {
        return;
    }
    let (sp, len) = (src.as_ptr(), src.len());
    let (p0, p1, q0, q1, op) = (x0.as_ptr(), x1.as_ptr(), w0.as_ptr(), w1.as_ptr(), out.as_mut_ptr());
    // Lane j's four byte indices for float d of the table: 4d + (0, 1, 2, 3).
    let bytes = vdupq_n_u32(0x0302_0100);
    let mut i = 0;
    while i + 4 <= n {
        // Relative to the block's first index, every tap must be in 0..8 (unsigned: one below
        // it wraps to a large value), and the eight floats from there inside the row.
        // SAFETY: i + 4 <= n, and no slice of the indices is shorter than n.
        let (base, d0, d1) = unsafe {
            let base = *p0.add(i);
            let b = vdupq_n_u32(base);
            (base as usize, vsubq_u32(vld1q_u32(p0.add(i)), b), vsubq_u32(vld1q_u32(p1.add(i)), b))
        };
        if vmaxvq_u32(vorrq_u32(d0, d1)) < 8 && base + 8 <= len {
            // SAFETY: base + 8 <= src.len() (checked just above); i + 4 <= n, and neither the
            // weights nor `out` are shorter than n.
            unsafe {
                let table = uint8x16x2_t(vld1q_u8(sp.add(base) as *const u8), vld1q_u8(sp.add(base + 4) as *const u8));
                let a = vreinterpretq_f32_u8(vqtbl2q_u8(table, vreinterpretq_u8_u32(vmlaq_n_u32(bytes, d0, 0x0404_0404))));
                let c = vreinterpretq_f32_u8(vqtbl2q_u8(table, vreinterpretq_u8_u32(vmlaq_n_u32(bytes, d1, 0x0404_0404))));
                let r = vaddq_f32(vmulq_f32(a, vld1q_f32(q0.add(i))), vmulq_f32(c, vld1q_f32(q1.add(i))));
                vst1q_f32(op.add(i), r);
            }
        } else {
            super::lerp_scalar(src, x0, x1, w0, w1, out, i..i + 4);
        }
        i += 4;
    }
    super::lerp_scalar(src, x0, x1, w0, w1, out, i..n);
}

/// The 4x4 transpose of four vectors (vector r of the result holds lane r of each input).
#[inline(always)]
fn transpose4(v: [float32x4_t; 4]) -> [float32x4_t; 4] {
    // SAFETY: NEON (every aarch64 CPU); the intrinsics only move lanes between registers.
    unsafe {
        let (t0, t1) = (vtrn1q_f32(v[0], v[1]), vtrn2q_f32(v[0], v[1]));
        let (t2, t3) = (vtrn1q_f32(v[2], v[3]), vtrn2q_f32(v[2], v[3]));
        let (t0, t1, t2, t3) = (vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t2), vreinterpretq_f64_f32(t3));
        [
            vreinterpretq_f32_f64(vzip1q_f64(t0, t2)),
            vreinterpretq_f32_f64(vzip1q_f64(t1, t3)),
            vreinterpretq_f32_f64(vzip2q_f64(t0, t2)),
            vreinterpretq_f32_f64(vzip2q_f64(t1, t3)),
        ]
    }
}

/// `lanes[x * 8 + r] = rows[r][x]` for whole blocks of 4 columns below the shortest row (and
/// `lanes`' length / 8): returns the columns done (the caller's portable loop does the rest).
///
/// # Safety
/// None beyond NEON: every read and write stays inside the slices, whatever their lengths.
#[target_feature(enable = "neon")]
pub(super) unsafe fn rows_to_lanes(rows: &[&[f32]; 8], lanes: &mut [f32]) -> usize {
    let w = rows.iter().map(|r| r.len()).min().unwrap_or(0).min(lanes.len() / 8);
    let lp = lanes.as_mut_ptr();
    let mut x = 0;
    while x + 4 <= w {
        // SAFETY: x + 4 <= w, which no row is shorter than, and 8 * w <= lanes.len().
        unsafe {
            let mut v = [vdupq_n_f32(0.0); 8];
            for r in 0..8 {
                v[r] = vld1q_f32(rows[r].as_ptr().add(x));
            }
            let lo = transpose4([v[0], v[1], v[2], v[3]]);
            let hi = transpose4([v[4], v[5], v[6], v[7]]);
            for j in 0..4 {
                vst1q_f32(lp.add((x + j) * 8), lo[j]);
                vst1q_f32(lp.add((x + j) * 8 + 4), hi[j]);
            }
        }
        x += 4;
    }
    x
}

/// `ring[at[r] + i] = lanes[i * 8 + r]` for whole blocks of 4 values of i in 0..ow: returns
/// the values done (the caller's portable loop does the rest).
///
/// # Safety
/// Every `at[r] + ow <= ring.len()` and `8 * ow <= lanes.len()` (the caller asserts it).
#[target_feature(enable = "neon")]
pub(super) unsafe fn lanes_to_rows(lanes: &[f32], ring: &mut [f32], ow: usize, at: &[usize]) -> usize {
    let at: &[usize; 8] = at.try_into().expect("eight rows");
    let (lp, rp) = (lanes.as_ptr(), ring.as_mut_ptr());
    let mut i = 0;
    while i + 4 <= ow {
        // SAFETY: every row `at[r]..at[r] + ow` is inside `ring` and 8 * ow <= lanes.len()
        // (this function's contract), and i + 4 <= ow.
        unsafe {
            let mut v = [vdupq_n_f32(0.0); 8];
            for j in 0..4 {
                v[j] = vld1q_f32(lp.add((i + j) * 8));
                v[j + 4] = vld1q_f32(lp.add((i + j) * 8 + 4));
            }
            let lo = transpose4([v[0], v[1], v[2], v[3]]);
            let hi = transpose4([v[4], v[5], v[6], v[7]]);
            for r in 0..4 {
                vst1q_f32(rp.add(at[r] + i), lo[r]);
                vst1q_f32(rp.add(at[r + 4] + i), hi[r]);
            }
        }
        i += 4;
    }
    i
}
