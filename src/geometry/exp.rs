//! `f32::exp` over a slice, vectorised, with libm's bits (the `exp` remap of MoGe-2's
//! depth runs once per output pixel, 2 M times per 1080p photo, and libm's scalar `expf` was
//! ~5 ms of the host work).
//!
//! The algorithm is glibc's `expf` (sysdeps/ieee754/flt-32/e_expf.c, glibc 2.27 and later):
//! x·32/ln2 = k + r, exp(x) = 2^(k/32) · p(r) in double precision, 2^(k/32) from a 32-entry
//! table. glibc's x86-64 build picks the FMA variant on CPUs with FMA, whose compiler fused four
//! multiply-adds; fused the same way, it matched `f32::exp` on every finite |x| < 88 (checked
//! exhaustively once, 2 237 661 184 inputs, on glibc 2.36). Inputs outside that range (overflow,
//! underflow, NaN) take `f32::exp` itself. Only CPUs with FMA (the `avx2` level and above) take
//! the vector route, and only after a sample agrees with this process's libm (another libm, or
//! glibc's non-FMA variant, rounds differently): otherwise every value takes `f32::exp`.

use std::sync::OnceLock;

use crate::simd::isa::{self, Isa};

/// glibc's `__exp2f_data.tab`: the bits of 2^(i/32), less i << 47 (added back with k).
const T: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// 32/ln2 (0x1.71547652b82fep+5).
const INV_LN2_N: f64 = f64::from_bits(0x4047_1547_652b_82fe);
/// 1.5·2⁵²: adding it rounds to an integer, kept in the low bits.
const SHIFT: f64 = 6_755_399_441_055_744.0;
/// The polynomial, scaled for r in units of ln2/32 (0x1.c6af84b912394p-20, 0x1.ebfce50fac4f3p-13,
/// 0x1.62e42ff0c52d6p-6).
const C0: f64 = f64::from_bits(0x3ebc_6af8_4b91_2394);
const C1: f64 = f64::from_bits(0x3f2e_bfce_50fa_c4f3);
const C2: f64 = f64::from_bits(0x3f96_2e42_ff0c_52d6);

/// The fast path of glibc's `expf` for |x| < 88 (garbage, but no panic, outside it). Run only
/// in the builds with the `fma` target feature, where `mul_add` is one instruction.
#[inline(always)]
fn fast(x: f32) -> f32 {
    let xd = x as f64;
    let k = INV_LN2_N.mul_add(xd, SHIFT);
    let ki = k.to_bits();
    let kd = k - SHIFT;
    let r = INV_LN2_N.mul_add(xd, -kd);
    let s = f64::from_bits(T[(ki % 32) as usize].wrapping_add(ki << 47));
    let z = C0.mul_add(r, C1);
    let y = C2.mul_add(r, 1.0);
    let y = z.mul_add(r * r, y);
    (y * s) as f32
}

/// Values are done in blocks: the block's inputs are kept so that the few outside the fast
/// path's range can be redone by `f32::exp` after the branch-free, vectorised pass.
const BLOCK: usize = 64;

crate::simd::dispatch! {
    fn exp_blocks / exp_blocks_baseline(v: &mut [f32]) {
        let mut keep = [0f32; BLOCK];
        for block in v.chunks_mut(BLOCK) {
            let keep = &mut keep[..block.len()];
            keep.copy_from_slice(block);
            block.iter_mut().for_each(|x| *x = fast(*x));
            // Outside the fast path's range (NaN too).
            let outside = |input: f32| {
                let a = input.abs();
                a >= 88.0 || a.is_nan()
            };
            // Whether any input is, tested branch-free over the block (it vectorises); a test
            // and branch per value was half of this function's time.
            if keep.iter().fold(false, |any, &input| any | outside(input)) {
                for (x, &input) in block.iter_mut().zip(keep.iter()) {
                    if outside(input) {
                        *x = input.exp();
                    }
                }
            }
        }
    }
}

/// The vector route at `level`, if any: CPUs with FMA only (elsewhere `mul_add` is a libm call,
/// and glibc's `expf` is its plain variant, whose bits differ).
fn run(level: Isa, v: &mut [f32]) -> bool {
    let level = isa::usable(level);
    if level < Isa::Avx2 {
        return false;
    }
    exp_blocks(level, v);
    true
}

/// Whether the vector route gives this process's `f32::exp` bits (checked once, on values
/// across the range and the points where glibc's FMA and plain variants differ).
fn agrees_with_libm() -> bool {
    static AGREES: OnceLock<bool> = OnceLock::new();
    *AGREES.get_or_init(|| {
        let mut xs: Vec<f32> = (0..4096).map(|i| -87.9 + 175.8 * i as f32 / 4095.0).collect();
        xs.extend((0..2048).map(|i| f32::from_bits(0x3000_0000 + i * 0x7_7777)));
        xs.extend([32.564_632, 0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 89.0, -104.0, f32::INFINITY, f32::NEG_INFINITY]);
        let want: Vec<u32> = xs.iter().map(|x| x.exp().to_bits()).collect();
        if !run(isa::detected(), &mut xs) {
            return false;
        }
        xs.iter().zip(&want).all(|(g, &w)| g.to_bits() == w)
    })
}

/// `*x = x.exp()` for every value, with the same bits, vectorised where the CPU allows.
pub fn exp_in_place(v: &mut [f32]) {
    exp_in_place_at(isa::current(), v)
}

/// [`exp_in_place`] at ISA level `level` (lowered to what the CPU has).
pub fn exp_in_place_at(level: Isa, v: &mut [f32]) {
    if agrees_with_libm() && run(level, v) {
        return;
    }
    v.iter_mut().for_each(|x| *x = x.exp());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every level gives libm's bits, on a dense sweep of the depth range MoGe-2 produces, on
    /// random bit patterns (any sign, exponent, NaN, infinity, subnormal) and on the edges.
    #[test]
    fn gives_libm_bits_at_every_level() {
        let mut xs: Vec<f32> = (0..400_000).map(|i| -20.0 + 32.0 * i as f32 / 400_000.0).collect();
        let mut rng = crate::test_rng::Rng::new(0x2545_f491_4f6c_dd1d);
        xs.extend((0..200_000).map(|_| f32::from_bits(rng.next_u64() as u32)));
        xs.extend([0.0, -0.0, 88.0, -88.0, 87.99, -87.99, 88.72, 89.0, -103.9, -150.0, f32::MAX, f32::MIN, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
        xs.extend((0..64).map(f32::from_bits));
        let want: Vec<f32> = xs.iter().map(|x| x.exp()).collect();
        for level in isa::levels() {
            // A length that is not a multiple of the block, so the tail is covered.
            let mut got = xs.clone();
            exp_in_place_at(level, &mut got[..xs.len() - 3]);
            for (i, (g, w)) in got[..xs.len() - 3].iter().zip(&want).enumerate() {
                assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{level}: exp({:e}) = {g:e}, libm {w:e}", xs[i]);
            }
            assert_eq!(got[xs.len() - 3..], xs[xs.len() - 3..], "values past the slice are untouched");
        }
        // On glibc the vector route is taken where the CPU has FMA (the check is not vacuous).
        if cfg!(all(target_arch = "x86_64", target_env = "gnu")) && isa::detected() >= Isa::Avx2 {
            assert!(agrees_with_libm(), "the vector route disagrees with this glibc's expf");
        }
    }
}
