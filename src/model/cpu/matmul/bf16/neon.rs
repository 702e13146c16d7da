//! The aarch64 bf16 route (`Isa::Bf16`: Graviton 3 and later, Apple M2 and later): the register
//! tile of `mmla.rs`'s layout on `bfmmla`.
//!
//! `bfmmla` is written with `asm!` (its intrinsic is not stable in Rust), in a function compiled
//! for the bf16 extension; the loads and the stores are plain NEON. Called only on the route
//! that `super::route` gives where the CPU has the extension (`crate::simd::isa`).

use core::arch::aarch64::*;
use core::arch::asm;

use super::mmla::{MR, NT, QUAD};
use crate::simd::{MatMut, MatRef};

/// C (mv × nv, mv ≤ MR, nv ≤ NT) (+)= A · B over `a.cols()` k pairs (even): A mv rows of bf16
/// pairs, B (`b`) the tile's four column pairs of each quad, QUAD words apart.
///
/// # Safety
/// The CPU has bf16; every element of `a` and `c` is readable (and writable), and `b` holds
/// `a.cols() / 2` quads of QUAD words.
pub(super) unsafe fn kernel(a: MatRef<u32>, b: *const u32, c: MatMut<f32>, load_c: bool) {
    debug_assert!(c.rows() <= MR && c.cols() <= NT && a.rows() == c.rows() && a.cols().is_multiple_of(2));
    macro_rules! go {
        ($($p:literal: $rows:pat),*) => {
            // SAFETY: the caller's promise, passed on; P = ⌈mv / 2⌉ row pairs.
            match c.rows() { 0 => {}, $($rows => unsafe { pairs::<$p>(a, b, c, load_c) },)* _ => unreachable!() }
        };
    }
    go!(1: 1 | 2, 2: 3 | 4, 3: 5 | 6, 4: 7 | 8)
}

/// [`kernel`] for P row pairs (the last one's second row repeats its first where mv is odd:
/// read, never stored).
///
/// # Safety
/// As [`kernel`], 2P − 1 ≤ mv ≤ 2P.
#[target_feature(enable = "neon,bf16")]
unsafe fn pairs<const P: usize>(a: MatRef<u32>, b: *const u32, c: MatMut<f32>, load_c: bool) {
    let (mv, nv, lda) = (c.rows(), c.cols(), a.stride());
    let row = |r: usize| a.ptr().wrapping_add(r.min(mv - 1) * lda);
    let rows: [(*const u32, *const u32); P] = core::array::from_fn(|p| (row(2 * p), row(2 * p + 1)));
    // acc[p][c]: rows 2p, 2p + 1 × columns 2c, 2c + 1, as (r0c0, r0c1, r1c0, r1c1).
    let mut acc = [[vdupq_n_f32(0.0); 4]; P];
    let mut b = b;
    for q in 0..a.cols() / 2 {
        // SAFETY: quad q's 16 words of the tile's column pairs, and 2 words of each row at
        // pair 2q (each row holds a.cols() of them): the caller's promise.
        unsafe {
            let bs = [vld1q_u32(b), vld1q_u32(b.add(4)), vld1q_u32(b.add(8)), vld1q_u32(b.add(12))];
            for (acc, &(r0, r1)) in acc.iter_mut().zip(&rows) {
                let ar = vcombine_u32(vld1_u32(r0.add(2 * q)), vld1_u32(r1.add(2 * q)));
                for (acc, &bc) in acc.iter_mut().zip(&bs) {
                    asm!("bfmmla {acc:v}.4s, {a:v}.8h, {b:v}.8h", acc = inout(vreg) *acc, a = in(vreg) ar, b = in(vreg) bc, options(pure, nomem, nostack));
                }
            }
        }
        b = b.wrapping_add(QUAD);
    }
    for (p, acc) in acc.iter().enumerate() {
        // Row 2p's eight columns, then row 2p + 1's.
        let [even, odd] = crate::simd::neon::pair_rows(acc);
        for (r, halves) in [(2 * p, even), (2 * p + 1, odd)] {
            if r >= mv {
                continue;
            }
            let cr = c.row(r);
            if nv == NT {
                // SAFETY: row r of C holds NT readable and writable floats.
                unsafe {
                    for (h, &v) in halves.iter().enumerate() {
                        let v = if load_c { vaddq_f32(vld1q_f32(cr.add(4 * h)), v) } else { v };
                        vst1q_f32(cr.add(4 * h), v);
                    }
                }
                continue;
            }
            let mut out = [0f32; NT];
            // SAFETY: `out` holds NT = 8 floats.
            unsafe {
                vst1q_f32(out.as_mut_ptr(), halves[0]);
                vst1q_f32(out.as_mut_ptr().add(4), halves[1]);
            }
            // SAFETY: row r of C holds nv < NT readable and writable floats.
            let cr = unsafe { std::slice::from_raw_parts_mut(cr, nv) };
            for (o, &s) in cr.iter_mut().zip(&out) {
                *o = if load_c { *o + s } else { s };
            }
        }
    }
}
