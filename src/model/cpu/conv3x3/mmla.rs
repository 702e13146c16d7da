//! The direct route in bf16 on 2 × 2 matrix multiply-adds (`Isa::Bf16`: Arm's `bfmmla`, in
//! `neon.rs`): the layout of its slab and weights, and the register tile in portable code, the
//! twin that every machine's tests run over the same layout and loops.
//!
//! `bfmmla` multiplies two rows of four bf16 k by two columns of the same four k into a 2 × 2
//! block of f32 sums (`matmul/bf16/mmla.rs` has it for the GEMM). Here k is the input channel:
//! - the slab holds, per input row and per quad of channels (4q .. 4q + 4), each pixel's four
//!   channels as two bf16 pair words side by side, so two neighbouring pixels' quads are one
//!   16-byte read at any pixel, and a tap (ky, kx) is that read moved on by ky slab rows and 2kx
//!   words: the 9x unfold of im2col never happens;
//! - the weights hold, per pair of output channels, per tap, per quad, the two channels' four
//!   weights (two pair words each) side by side: one 16-byte read.
//!
//! Channels are padded to whole quads and output channels to whole pairs, with zeros. A register
//! tile is [`ROWS`] output channels × [`PIX`] pixels of one output row: four row pairs × four
//! pixel pairs, 16 accumulators.

use crate::model::cpu::matmul::bf16::pair;
use crate::simd::{MatMut, MatRef};

/// Output channels per register tile: four pairs.
pub(super) const ROWS: usize = 8;
/// Pixels per register tile: four pairs.
pub(super) const PIX: usize = 8;

/// One register tile ([`kernel_emulated`] documents it): `bfmmla`'s (`neon.rs`) or the portable
/// twin's; the caller picks.
pub(super) type Tile = unsafe fn(*const u32, MatRef<u32>, &[usize; 9], *const f32, Option<MatRef<f32>>, MatMut<f32>);

/// Words per pixel of a slab row, all quads (and per output channel and tap of the weights):
/// two pair words per quad of channels.
pub(super) fn words_per_pixel(cin: usize) -> usize {
    2 * cin.div_ceil(4)
}

/// PyTorch's (cout, cin, 3, 3) weight in this layout: row pair p, tap t, quad q at words
/// `((p · 9 + t) · quads + q) · 4`: row 2p's pairs (4q, 4q + 1) and (4q + 2, 4q + 3), then row
/// 2p + 1's. Row pair p starts at word 2p · 9 · [`words_per_pixel`], where row 2p of a plain
/// (cout, 9 · words) layout would.
pub(super) fn pack(w: &[f32], cin: usize, cout: usize) -> Vec<u32> {
    let at = |o: usize, c: usize, t: usize| if o < cout && c < cin { w[(o * cin + c) * 9 + t] } else { 0.0 };
    let quads = cin.div_ceil(4);
    let mut words = vec![0u32; cout.div_ceil(2) * 9 * quads * 4];
    for (i, word) in words.iter_mut().enumerate() {
        let (h, r, q, t, p) = (i % 2, (i / 2) % 2, (i / 4) % quads, (i / (4 * quads)) % 9, i / (36 * quads));
        let (o, c) = (2 * p + r, 4 * q + 2 * h);
        *word = pair(at(o, c, t), at(o, c + 1, t));
    }
    words
}

/// A slab row of one quad (`dst`, 2 words a pixel) from its two pair rows (a word a pixel).
pub(super) fn interleave(lo: &[u32], hi: &[u32], dst: &mut [u32]) {
    for ((d, &a), &b) in dst.chunks_exact_mut(2).zip(lo).zip(hi) {
        d[0] = a;
        d[1] = b;
    }
}

/// C (mv × nv, mv ≤ ROWS, nv ≤ PIX) = bias + [add +] Σ_taps Σ_quads A · B_tap in portable code,
/// each 2 × 2 block's four products summed in two pairs as `bfmmla` does (its sums round
/// otherwise: the tests compare with a tolerance). A (`a`): the tile's row pairs in [`pack`]'s
/// layout, 36 · quads words apart. B_tap: `b` (one row per quad, 2 words a pixel, 2 · PIX
/// readable words each whatever nv) moved on by `taps[t]` words. `bias` holds mv values and
/// `add` (mv × nv) is added at the end.
///
/// # Safety
/// Every element of A's ⌈mv / 2⌉ row pairs, of `bias` and of `add` is readable, B_tap's 2 · PIX
/// words of each quad row for every tap, and every element of `c` is writable.
pub(super) unsafe fn kernel_emulated(a: *const u32, b: MatRef<u32>, taps: &[usize; 9], bias: *const f32, add: Option<MatRef<f32>>, c: MatMut<f32>) {
    let (mv, nv, quads, qs) = (c.rows(), c.cols(), b.rows(), b.stride());
    debug_assert!(mv <= ROWS && nv <= PIX);
    let bf = |w: u32, hi: bool| f32::from_bits(if hi { w & 0xffff_0000 } else { w << 16 });
    let dot = |x: u32, y: u32| bf(x, false) * bf(y, false) + bf(x, true) * bf(y, true);
    let mut acc = [[0f32; PIX]; ROWS];
    for (t, &tap) in taps.iter().enumerate() {
        for q in 0..quads {
            // SAFETY: quad q's row of this tap's B, 2 · PIX words (the caller's promise).
            let bq = unsafe { std::slice::from_raw_parts(b.ptr().add(tap + q * qs), 2 * PIX) };
            for (r, acc) in acc.iter_mut().enumerate().take(mv) {
                // SAFETY: row r's two words of tap t, quad q, in its row pair's block.
                let aw = unsafe { std::slice::from_raw_parts(a.add((r / 2) * 36 * quads + (t * quads + q) * 4 + 2 * (r % 2)), 2) };
                for (j, acc) in acc.iter_mut().enumerate().take(nv) {
                    *acc += dot(aw[0], bq[2 * j]) + dot(aw[1], bq[2 * j + 1]);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate().take(mv) {
        // SAFETY: row r of C holds nv writable floats, of `add` nv readable ones, and `bias`
        // mv floats.
        let (cr, b) = unsafe { (std::slice::from_raw_parts_mut(c.row(r), nv), *bias.add(r)) };
        for (j, (o, &s)) in cr.iter_mut().zip(acc).enumerate() {
            // SAFETY: as above.
            *o = b + s + add.map_or(0.0, |add| unsafe { *add.row(r).add(j) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each word of the packed weights is the pair its place names, padding zero.
    #[test]
    fn pack_places_row_pairs_and_quads() {
        let (cin, cout) = (6, 3);
        let w: Vec<f32> = (0..cout * cin * 9).map(|i| (i + 1) as f32).collect();
        let words = pack(&w, cin, cout);
        let quads = 2;
        assert_eq!(words.len(), 2 * 9 * quads * 4);
        let bf = |w: u32, hi: bool| f32::from_bits(if hi { w & 0xffff_0000 } else { w << 16 });
        for p in 0..2 {
            for t in 0..9 {
                for q in 0..quads {
                    for r in 0..2 {
                        for h in 0..2 {
                            let word = words[((p * 9 + t) * quads + q) * 4 + 2 * r + h];
                            let (o, c) = (2 * p + r, 4 * q + 2 * h);
                            // Integers to 162: exact in bf16.
                            let want = |c: usize| if o < cout && c < cin { w[(o * cin + c) * 9 + t] } else { 0.0 };
                            assert_eq!((bf(word, false), bf(word, true)), (want(c), want(c + 1)), "p={p} t={t} q={q} r={r} h={h}");
                        }
                    }
                }
            }
        }
    }
}
