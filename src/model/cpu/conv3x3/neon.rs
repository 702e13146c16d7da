//! The direct route's register tile on `bfmmla` (`Isa::Bf16`: Graviton 3 and later, Apple M2
//! and later), over `mmla.rs`'s layout; the portable twin there runs the same loops.
//!
//! `bfmmla` is written with `asm!` (its intrinsic is not stable in Rust), in a function compiled
//! for the bf16 extension; the loads and the stores are plain NEON. Called only on the route
//! that `super::route` gives where the CPU has the extension (`crate::simd::isa`).

use core::arch::aarch64::*;
use core::arch::asm;

use super::mmla::{PIX, ROWS};
use crate::simd::{MatMut, MatRef};

/// `mmla::kernel_emulated`'s tile on `bfmmla`: C (mv × nv, mv ≤ ROWS, nv ≤ PIX) = bias + [add +]
/// Σ_taps Σ_quads A · B_tap.
///
/// # Safety
/// The CPU has bf16; otherwise as `mmla::kernel_emulated`.
pub(super) unsafe fn kernel(a: *const u32, b: MatRef<u32>, taps: &[usize; 9], bias: *const f32, add: Option<MatRef<f32>>, c: MatMut<f32>) {
    debug_assert!(c.rows() <= ROWS && c.cols() <= PIX);
    macro_rules! go {
        ($($p:literal: $rows:pat),*) => {
            // SAFETY: the caller's promise, passed on; P = ⌈mv / 2⌉ row pairs.
            match c.rows() { 0 => {}, $($rows => unsafe { pairs::<$p>(a, b, taps, bias, add, c) },)* _ => unreachable!() }
        };
    }
    go!(1: 1 | 2, 2: 3 | 4, 3: 5 | 6, 4: 7 | 8)
}

/// [`kernel`] for P row pairs (the last one's second row, where mv is odd, is the packed
/// weights' zero padding: summed, never stored).
///
/// # Safety
/// As [`kernel`], 2P − 1 ≤ mv ≤ 2P.
#[target_feature(enable = "neon,bf16")]
unsafe fn pairs<const P: usize>(a: *const u32, b: MatRef<u32>, taps: &[usize; 9], bias: *const f32, add: Option<MatRef<f32>>, c: MatMut<f32>) {
    let (mv, nv, quads, qs) = (c.rows(), c.cols(), b.rows(), b.stride());
    // acc[p][j]: rows 2p, 2p + 1 × pixels 2j, 2j + 1, as (r0p0, r0p1, r1p0, r1p1), from the bias.
    let mut acc: [[float32x4_t; 4]; P] = core::array::from_fn(|p| {
        // SAFETY: `bias` holds mv values (the caller's promise); the indices are below mv (the
        // padding row of an odd mv takes its pair's bias: never stored).
        let (b0, b1) = unsafe { (*bias.add(2 * p), *bias.add((2 * p + 1).min(mv - 1))) };
        let v = [b0, b0, b1, b1];
        // SAFETY: `v` holds 4 floats.
        [unsafe { vld1q_f32(v.as_ptr()) }; 4]
    });
    for (t, &tap) in taps.iter().enumerate() {
        let mut bq = b.ptr().wrapping_add(tap);
        let mut aq = a.wrapping_add(t * quads * 4);
        for _ in 0..quads {
            // SAFETY: 2 · PIX = 16 words of this quad's row of the tap's B, and 4 words of each
            // row pair's block at this tap and quad (the caller's promise).
            unsafe {
                let bs = [vld1q_u32(bq), vld1q_u32(bq.add(4)), vld1q_u32(bq.add(8)), vld1q_u32(bq.add(12))];
                for (p, acc) in acc.iter_mut().enumerate() {
                    let ar = vld1q_u32(aq.add(p * 36 * quads));
                    for (acc, &bc) in acc.iter_mut().zip(&bs) {
                        asm!("bfmmla {acc:v}.4s, {a:v}.8h, {b:v}.8h", acc = inout(vreg) *acc, a = in(vreg) ar, b = in(vreg) bc, options(pure, nomem, nostack));
                    }
                }
            }
            // The next quad's (past the last after the last: never read).
            bq = bq.wrapping_add(qs);
            aq = aq.wrapping_add(4);
        }
    }
    for (p, acc) in acc.iter().enumerate() {
        // Row 2p's eight pixels, then row 2p + 1's.
        let [even, odd] = crate::simd::neon::pair_rows(acc);
        for (r, halves) in [(2 * p, even), (2 * p + 1, odd)] {
            if r >= mv {
                continue;
            }
            let mut out = [0f32; PIX];
            // SAFETY: `out` holds PIX = 8 floats.
            unsafe {
                vst1q_f32(out.as_mut_ptr(), halves[0]);
                vst1q_f32(out.as_mut_ptr().add(4), halves[1]);
            }
            if let Some(add) = add {
                // SAFETY: row r of `add` holds nv readable floats.
                let ar = unsafe { std::slice::from_raw_parts(add.row(r), nv) };
                out.iter_mut().zip(ar).for_each(|(o, &a)| *o += a);
            }
            // SAFETY: row r of C holds nv writable floats.
            unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), c.row(r), nv) };
        }
    }
}
