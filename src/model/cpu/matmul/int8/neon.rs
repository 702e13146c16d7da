//! The aarch64 routes of the int8 products, on register tiles of 8 × 8 (16 accumulators of
//! i32 × 4). The sums are exact and the epilogue is the VNNI routes' (`avx512vnni.rs`), so every
//! route gives the same bits.
//!
//! - dotprod (`Route::Dotprod`): `sdot` by element, the four s8 weights of four channels against
//!   one quad of a row, the row's quads loaded four at a time (K padded to 16). `sdot` is s8 × s8,
//!   so the u8 activations are moved to s8 by flipping their top bit (u − 128), and the 128 · Σq
//!   this takes off is given back in the epilogue: Σ(u − 128)q + (128 − z)Σq = Σuq − zΣq.
//! - i8mm (`Route::I8mm`): `usmmla`, u8 × s8 as VNNI's, a 2 × 8 block of two rows' eight k times
//!   an 8 × 2 block of two channels' (32 multiply-adds an instruction, twice `sdot`'s): the
//!   panels hold each octet of k as pairs of channels, eight bytes each (K padded to 8), and two
//!   rows' eight bytes are read into one register.
//!
//! The dot instructions are written with `asm!` (their intrinsics are not stable in Rust),
//! one instruction a block, in functions compiled for the extension; everything else is
//! plain NEON, which every aarch64 CPU has. Called only on the routes that `super::route`
//! gives where the CPU has the extension (`crate::simd::isa`).

use core::arch::aarch64::*;
use core::arch::asm;

use super::Tile;

pub(super) const MR: usize = 8;
pub(super) const NR: usize = 8;

/// `acc += Σ_j b[4c + j] · a[4·LANE + j]` for each of acc's four lanes c (s8 × s8).
macro_rules! sdot {
    ($acc:expr, $b:expr, $a:expr, $lane:literal) => {
        // SAFETY: register operands only (the enclosing function is compiled with dotprod).
        unsafe { asm!(concat!("sdot {acc:v}.4s, {b:v}.16b, {a:v}.4b[", $lane, "]"), acc = inout(vreg) $acc, b = in(vreg) $b, a = in(vreg) $a, options(pure, nomem, nostack)) }
    };
}

/// C (mv × nv) = the tile's product, scaled, plus the bias, by `sdot`.
///
/// # Safety
/// The CPU has dotprod; `t.holds(8)`, mv ≤ 8, `t.kq` a multiple of 4; the tile's C is writable.
pub(super) unsafe fn dotprod(t: &Tile) {
    debug_assert!(t.holds(NR) && t.c.rows() <= MR && t.kq.is_multiple_of(4));
    macro_rules! go {
        ($($r:literal)*) => {
            // SAFETY: the caller's promise, passed on; R = mv.
            match t.c.rows() { 0 => {}, $($r => unsafe { dotprod_rows::<$r>(t) },)* _ => unreachable!() }
        };
    }
    go!(1 2 3 4 5 6 7 8)
}

/// [`dotprod`] for R = mv rows.
///
/// # Safety
/// As [`dotprod`].
#[target_feature(enable = "neon,dotprod")]
unsafe fn dotprod_rows<const R: usize>(t: &Tile) {
    let (lda, kq) = (t.lda, t.kq);
    let (a, mut b) = (t.a.as_ptr(), t.b.as_ptr() as *const i8);
    let flip = vdupq_n_u8(0x80);
    let mut acc = [[vdupq_n_s32(0); 2]; R];
    for g in 0..kq / 4 {
        // Each row's next four quads, as s8 (u − 128).
        // SAFETY: each of the R rows holds kq quads (`holds`).
        let rows: [int8x16_t; R] = core::array::from_fn(|r| unsafe { vreinterpretq_s8_u8(veorq_u8(vld1q_u8(a.add(r * lda + 16 * g)), flip)) });
        macro_rules! quad {
            ($lane:literal) => {
                // SAFETY: the panel holds kq · NR words: quad 4g + lane's NR of them.
                let (b0, b1) = unsafe { (vld1q_s8(b), vld1q_s8(b.add(16))) };
                for (acc, &ar) in acc.iter_mut().zip(&rows) {
                    sdot!(acc[0], b0, ar, $lane);
                    sdot!(acc[1], b1, ar, $lane);
                }
                b = b.wrapping_add(4 * NR);
            };
        }
        quad!(0);
        quad!(1);
        quad!(2);
        quad!(3);
    }
    // Σ(u − 128)q → Σuq − zΣq: add (128 − z)Σq.
    // SAFETY: the slices hold NR values each (`holds`).
    let cs = unsafe { [vld1q_s32(t.colsum.as_ptr()), vld1q_s32(t.colsum.as_ptr().add(4))] };
    for (r, acc) in acc.iter_mut().enumerate() {
        let back = vdupq_n_s32(128 - t.zero_a[r]);
        for h in 0..2 {
            acc[h] = vmlaq_s32(acc[h], back, cs[h]);
        }
    }
    // SAFETY: as above; mv = R.
    unsafe { store(t, &acc) };
}

/// C (mv × nv) = the tile's product, scaled, plus the bias, by `usmmla`.
///
/// # Safety
/// The CPU has i8mm; `t.holds(8)`, mv ≤ 8, `t.kq` even, the panel in octets of channel pairs
/// (`super::QuantB::from_quantised`); the tile's C is writable.
pub(super) unsafe fn i8mm(t: &Tile) {
    debug_assert!(t.holds(NR) && t.c.rows() <= MR && t.kq.is_multiple_of(2));
    macro_rules! go {
        ($($p:literal: $rows:pat),*) => {
            // SAFETY: the caller's promise, passed on; P = ⌈mv / 2⌉ row pairs.
            match t.c.rows() { 0 => {}, $($rows => unsafe { i8mm_pairs::<$p>(t) },)* _ => unreachable!() }
        };
    }
    go!(1: 1 | 2, 2: 3 | 4, 3: 5 | 6, 4: 7 | 8)
}

/// [`i8mm`] for P row pairs (the last one's second row repeats its first where mv is odd).
///
/// # Safety
/// As [`i8mm`], 2P − 1 ≤ mv ≤ 2P.
#[target_feature(enable = "neon,i8mm")]
unsafe fn i8mm_pairs<const P: usize>(t: &Tile) {
    let (lda, mv) = (t.lda, t.c.rows());
    let (a, mut b) = (t.a.as_ptr(), t.b.as_ptr() as *const i8);
    // Rows 2p and 2p + 1 (the last row for a missing one: read, never stored).
    let row = |r: usize| a.wrapping_add(r.min(mv - 1) * lda);
    let pairs: [(*const u8, *const u8); P] = core::array::from_fn(|p| (row(2 * p), row(2 * p + 1)));
    // acc[p][c]: rows 2p, 2p + 1 × channels 2c, 2c + 1, as (r0c0, r0c1, r1c0, r1c1).
    let mut acc = [[vdupq_n_s32(0); 4]; P];
    for o in 0..t.kq / 2 {
        // SAFETY: the panel holds kq · NR words, octet o's 2 · NR of them; each row kq quads.
        unsafe {
            let bs = [vld1q_s8(b), vld1q_s8(b.add(16)), vld1q_s8(b.add(32)), vld1q_s8(b.add(48))];
            for (acc, &(r0, r1)) in acc.iter_mut().zip(&pairs) {
                let ar = vcombine_u8(vld1_u8(r0.add(8 * o)), vld1_u8(r1.add(8 * o)));
                for (acc, &bc) in acc.iter_mut().zip(&bs) {
                    asm!("usmmla {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) *acc, a = in(vreg) ar, b = in(vreg) bc, options(pure, nomem, nostack));
                }
            }
        }
        b = b.wrapping_add(8 * NR);
    }
    // Back to rows of four channels, less zΣq.
    // SAFETY: the slices hold NR values each (`holds`).
    let cs = unsafe { [vld1q_s32(t.colsum.as_ptr()), vld1q_s32(t.colsum.as_ptr().add(4))] };
    let mut rows = [[vdupq_n_s32(0); 2]; MR];
    for (p, acc) in acc.iter().enumerate() {
        let [c01, c23, c45, c67] = [vreinterpretq_s64_s32(acc[0]), vreinterpretq_s64_s32(acc[1]), vreinterpretq_s64_s32(acc[2]), vreinterpretq_s64_s32(acc[3])];
        let even = [vzip1q_s64(c01, c23), vzip1q_s64(c45, c67)];
        let odd = [vzip2q_s64(c01, c23), vzip2q_s64(c45, c67)];
        for (r, halves) in [(2 * p, even), (2 * p + 1, odd)] {
            if r < mv {
                let z = vdupq_n_s32(t.zero_a[r]);
                for h in 0..2 {
                    rows[r][h] = vmlsq_s32(vreinterpretq_s32_s64(halves[h]), z, cs[h]);
                }
            }
        }
    }
    // SAFETY: as above; the first mv rows are set.
    unsafe { store(t, &rows[..mv]) };
}

/// y = acc · (s_a · s_w) + bias for each of the tile's rows (acc already less zΣq), its first
/// nv columns stored (the GELU is the product's pass after, `super::product`).
///
/// # Safety
/// `acc` holds mv rows; the tile's slices hold NR values each and its C is mv × nv writable.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn store(t: &Tile, acc: &[[int32x4_t; 2]]) {
    debug_assert!(acc.len() == t.c.rows());
    let nv = t.c.cols();
    // SAFETY: NR scales and biases (the caller's promise).
    let (sw, bias) =
        unsafe { ([vld1q_f32(t.scale_b.as_ptr()), vld1q_f32(t.scale_b.as_ptr().add(4))], [vld1q_f32(t.bias.as_ptr()), vld1q_f32(t.bias.as_ptr().add(4))]) };
    for (r, acc) in acc.iter().enumerate() {
        let s = vdupq_n_f32(t.scale_a[r]);
        let y = [vfmaq_f32(bias[0], vcvtq_f32_s32(acc[0]), vmulq_f32(s, sw[0])), vfmaq_f32(bias[1], vcvtq_f32_s32(acc[1]), vmulq_f32(s, sw[1]))];
        let cr = t.c.row(r);
        if nv == NR {
            // SAFETY: row r of C holds NR = nv writable floats.
            unsafe {
                vst1q_f32(cr, y[0]);
                vst1q_f32(cr.add(4), y[1]);
            }
        } else {
            let mut tmp = [0f32; NR];
            // SAFETY: `tmp` holds NR floats.
            unsafe {
                vst1q_f32(tmp.as_mut_ptr(), y[0]);
                vst1q_f32(tmp.as_mut_ptr().add(4), y[1]);
            }
            // SAFETY: row r of C holds nv writable floats.
            unsafe { std::ptr::copy_nonoverlapping(tmp.as_ptr(), cr, nv) };
        }
    }
}
