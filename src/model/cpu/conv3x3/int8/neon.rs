//! The aarch64 kernels of the int8 convolution (`super`): a tile of 6 output channels × 16
//! pixels of one output row, 24 accumulators of i32 × 4 per tap (with the four pixel vectors,
//! two of weights and the flip constant: 31 of the 32 registers); the f32 sums across taps
//! live in a small array in L1, read and written once per tap, as the AVX-VNNI kernel's
//! (`super::avxvnni`).
//!
//! Per quad of input channels, each of the tile's channels multiplies its word of four s8
//! weights, taken by element, against the four pixel vectors (four u8 of each pixel):
//! - dotprod (`Route::Dotprod`): `sdot`, s8 × s8, so the pixels' bytes have their top bit
//!   flipped (u − 128) as they are loaded, and the 128 · Σq this takes off each sum is added
//!   back in i32 before the sums are scaled;
//! - i8mm (`Route::I8mm`): `usdot`, u8 × s8 as `vpdpbusd`, on the bytes as they are.
//!
//! Either way each tap's i32 sums are Σ u·q exactly, and the epilogue is the VNNI kernels'
//! (fused multiply-adds in the same order), so both routes give the same bits.
//! The dot instructions are written with `asm!` (their intrinsics are not stable in Rust), in
//! functions compiled for the extension. Called only on the routes that
//! `crate::model::cpu::matmul::int8::route` gives where the CPU has it (`crate::simd::isa`).

use core::arch::aarch64::*;
use core::arch::asm;

use super::ConvTile;

/// Pixels per tile: four vectors of 4.
pub(super) const TILE_PX: usize = 16;

/// One tile of the int8 convolution by `sdot`: [`super::TILE_CH`] output channels × 16 pixels
/// of one output row; `t.rows` channels and `t.cols` (≤ 16) pixels kept.
///
/// # Safety
/// The CPU has dotprod; `t.holds()`, `t.cols` ≤ 16; the tile's outputs (rows `t.hw` apart
/// from `t.out`, `t.cols` each) are writable.
pub(super) unsafe fn dotprod(t: &ConvTile) {
    debug_assert!(t.holds() && t.cols <= TILE_PX);
    // SAFETY: the caller's promise, passed on.
    unsafe {
        if t.planes.zero_free {
            conv_sdot::<false>(t)
        } else {
            conv_sdot::<true>(t)
        }
    }
}

/// [`dotprod`] by `usdot`.
///
/// # Safety
/// As [`dotprod`], the CPU having i8mm.
pub(super) unsafe fn i8mm(t: &ConvTile) {
    debug_assert!(t.holds() && t.cols <= TILE_PX);
    // SAFETY: the caller's promise, passed on.
    unsafe {
        if t.planes.zero_free {
            conv_usdot::<false>(t)
        } else {
            conv_usdot::<true>(t)
        }
    }
}

/// `acc` (+)= Σ_j px[4i + j] · w[4·LANE + j] in each lane i, by `$insn` (`sdot` or `usdot`).
macro_rules! dot {
    ($insn:literal, $acc:expr, $px:expr, $w:expr, $lane:literal) => {
        // SAFETY: register operands only (the enclosing kernel is compiled with the
        // instruction's extension).
        unsafe {
            asm!(concat!($insn, " {acc:v}.4s, {a:v}.16b, {w:v}.4b[", $lane, "]"), acc = inout(vreg) $acc, a = in(vreg) $px, w = in(vreg) $w, options(pure, nomem, nostack))
        }
    };
}

/// One quad's products for pixel vectors `$h`: each of the six channels' weight word (lanes
/// 0-3 of `$w0`, 2-3 of `$w1`) against the vector, its top bits flipped first where `$flip`.
macro_rules! pixels {
    ($insn:literal, $flip:literal, $acc:ident, $px:ident, $w0:ident, $w1:ident, $flipv:ident; $($h:literal)*) => {$(
        if $flip {
            $px[$h] = veorq_u8($px[$h], $flipv);
        }
        dot!($insn, $acc[0][$h], $px[$h], $w0, 0);
        dot!($insn, $acc[1][$h], $px[$h], $w0, 1);
        dot!($insn, $acc[2][$h], $px[$h], $w0, 2);
        dot!($insn, $acc[3][$h], $px[$h], $w0, 3);
        dot!($insn, $acc[4][$h], $px[$h], $w1, 2);
        dot!($insn, $acc[5][$h], $px[$h], $w1, 3);
    )*};
}

/// The kernel `$name`, compiled with `$feature`, multiplying by `$insn`; `$flip`: the pixels'
/// top bits flipped (an s8 × s8 instruction) and 128 · Σq given back. `ZERO`: the zero points'
/// correction (skipped where every zero point is 0, as after a ReLU).
macro_rules! conv_kernel {
    ($(#[$m:meta])* $name:ident, $feature:literal, $insn:literal, $flip:literal) => {
        $(#[$m])*
        ///
        /// # Safety
        /// As [`dotprod`], the CPU having `$feature`.
        #[target_feature(enable = $feature)]
        unsafe fn $name<const ZERO: bool>(t: &ConvTile) {
            use super::TILE_CH as R;
            let p = t.planes;
            let (plane, quads, taps) = (p.plane, t.quads, t.offsets.len());
            let flip = vdupq_n_u8(0x80);
            // Σ_t s[p+t] · (Σ_c u·q − z[p+t] · Σ_c q) per channel and pixel; s_w applies at
            // the end.
            let mut accf = [[0f32; TILE_PX]; R];
            // Indexed by literals and unrolled by macros throughout: closures and iterator
            // adapters here were left as calls (they do not take this function's features),
            // which kept the accumulators in memory.
            for tap in 0..taps {
                let at = t.base + t.offsets[tap];
                let mut acc = [[vdupq_n_s32(0); 4]; R];
                let mut a = p.data.as_ptr().wrapping_add(at) as *const u8;
                let mut wq = t.weights.as_ptr().wrapping_add(tap * quads * R);
                for _ in 0..quads {
                    // SAFETY: 16 words from `at` in each plane and R words per quad of this
                    // tap's weights are inside (`holds`); w1 reads words 2..6 of the quad's R.
                    let (mut px, w0, w1) = unsafe { ([vld1q_u8(a), vld1q_u8(a.add(16)), vld1q_u8(a.add(32)), vld1q_u8(a.add(48))], vld1q_s32(wq), vld1q_s32(wq.add(2))) };
                    pixels!($insn, $flip, acc, px, w0, w1, flip; 0 1 2 3);
                    a = a.wrapping_add(4 * plane);
                    wq = wq.wrapping_add(R);
                }
                // SAFETY: 16 scales (and scales · zero points) from `at` are inside (`holds`).
                let (s, sz) = unsafe {
                    let (s, sz) = (p.scale.as_ptr().add(at), p.scale_zero.as_ptr().add(at));
                    (
                        [vld1q_f32(s), vld1q_f32(s.add(4)), vld1q_f32(s.add(8)), vld1q_f32(s.add(12))],
                        [vld1q_f32(sz), vld1q_f32(sz.add(4)), vld1q_f32(sz.add(8)), vld1q_f32(sz.add(12))],
                    )
                };
                for r in 0..R {
                    let sum = t.sums[r * taps + tap];
                    // Σ(u − 128)q + 128 · Σq = Σuq, in i32 (Σq is exact as f32: |Σq| < 2²⁴).
                    let back = vdupq_n_s32(128 * sum as i32);
                    let corr = vdupq_n_f32(sum);
                    for h in 0..4 {
                        let acc = if $flip { vaddq_s32(acc[r][h], back) } else { acc[r][h] };
                        // SAFETY: `accf` rows hold 16 floats.
                        unsafe {
                            let f = accf[r].as_mut_ptr().add(4 * h);
                            let mut v = vfmaq_f32(vld1q_f32(f), vcvtq_f32_s32(acc), s[h]);
                            if ZERO {
                                v = vfmsq_f32(v, sz[h], corr);
                            }
                            vst1q_f32(f, v);
                        }
                    }
                }
            }
            for r in 0..t.rows {
                let (sw, b) = (t.scale_w[r], t.bias[r]);
                let out = t.out.wrapping_add(r * t.hw);
                for i in 0..t.cols {
                    // As the VNNI kernels: the residual added after the fused scale and bias.
                    let mut y = accf[r][i].mul_add(sw, b);
                    if let Some(res) = t.residual {
                        y += res[r * t.hw + i];
                    }
                    // SAFETY: the tile's nv pixels of row r are writable (the caller's promise).
                    unsafe { out.add(i).write(y) };
                }
            }
        }
    };
}

conv_kernel!(
    /// [`dotprod`]'s kernel.
    conv_sdot, "neon,dotprod", "sdot", true
);
conv_kernel!(
    /// [`i8mm`]'s kernel.
    conv_usdot, "neon,i8mm", "usdot", false
);
