//! The layout of the 2 × 2 matrix multiply-add route (`Kernel::Mmla`: Arm's `bfmmla`, in
//! `neon.rs`) and its portable twin, which runs the same loops over the same layout on any CPU
//! (the tests' way to check the layout and the loops where the instruction is missing).
//!
//! `bfmmla` multiplies a 2 × 4 block of bf16 (two rows of A, four k each) by a 4 × 2 block (two
//! columns of B, the same four k) into a 2 × 2 block of f32 sums, 16 multiply-adds an
//! instruction. A keeps the rows of pairs every route uses (`super::convert_rows`): two rows' four
//! k are two 8-byte reads. B's panels hold, per quad of k, each pair of columns' eight bf16 side
//! by side: words [c·k(2q), c·k(2q+1), c+1·k(2q), c+1·k(2q+1)], one 16-byte read. They are the
//! pair panels of the other routes with each quad's two rows of NR words interleaved by column
//! pair ([`interleave`]), so the packers are shared, and K is padded to whole quads.
//!
//! A register tile is 8 rows × 8 columns: four row pairs × four column pairs, 16 accumulators.

use super::NR;
use crate::simd::{MatMut, MatRef};

/// One register tile's multiply: C (mv × nv, mv ≤ MR, nv ≤ NT) (+)= A · B, A mv rows of
/// `a.cols()` pairs, B the tile's column pairs of each quad, QUAD words apart (`load_c`: add).
pub(super) type Tile = unsafe fn(MatRef<u32>, *const u32, MatMut<f32>, bool);

/// Rows of C per register tile.
pub(super) const MR: usize = 8;
/// Columns of C per register tile: four column pairs, a quarter of a panel.
pub(super) const NT: usize = 8;
/// Words of a panel per quad of k: two pairs of NR columns.
pub(super) const QUAD: usize = 2 * NR;

/// One panel's pair layout (`kps` pairs of NR words, `kps` even) rearranged in place into the
/// quad layout above.
pub(super) fn interleave(panel: &mut [u32], kps: usize) {
    debug_assert!(kps.is_multiple_of(2) && panel.len() >= kps * NR);
    for quad in panel[..kps * NR].chunks_exact_mut(QUAD) {
        let pairs: [u32; QUAD] = quad.try_into().expect("a quad's words");
        let (lo, hi) = pairs.split_at(NR);
        for c in 0..NR {
            quad[4 * (c / 2) + 2 * (c % 2)] = lo[c];
            quad[4 * (c / 2) + 2 * (c % 2) + 1] = hi[c];
        }
    }
}

/// All register tiles of C (`c`) for one k block: A (`a`) its rows' k pairs (an even number),
/// B (`b`) one row per NR columns of C in the quad layout. `tile` multiplies one register tile:
/// `bfmmla`'s (`neon.rs`) or the portable twin's ([`kernel_emulated`]); the parent picks it, so
/// that this layout does not import the instruction's file that imports the layout.
///
/// # Safety
/// The CPU runs `tile` (`bfmmla`: aarch64 bf16); every element of `a` and `b` is readable and
/// every element of `c` writable.
pub(super) unsafe fn block(a: MatRef<u32>, b: MatRef<u32>, c: MatMut<f32>, load_c: bool, tile: Tile) {
    let (rows, cols) = (c.rows(), c.cols());
    // B's panel outer (it stays in L1 while A's rows pass); each panel is four tiles wide.
    for (jp, j0) in (0..cols).step_by(NR).enumerate() {
        for j in (j0..(j0 + NR).min(cols)).step_by(NT) {
            let nv = (cols - j).min(NT);
            // The tile's four column pairs, in each quad of the panel.
            let bt = b.row(jp).wrapping_add(2 * (j - j0));
            for r0 in (0..rows).step_by(MR) {
                let mv = (rows - r0).min(MR);
                let (at, ct) = (a.block(r0, 0, mv, a.cols()), c.block(r0, j, mv, nv));
                // SAFETY: the caller's promise, for one tile of it.
                unsafe { tile(at, bt, ct, load_c) };
            }
        }
    }
}

/// The register tile of [`block`] in portable code: C (mv × nv, mv ≤ MR, nv ≤ NT) (+)= A · B,
/// A mv rows of `a.cols()` pairs, B (`b`) the tile's column pairs of each quad, QUAD words
/// apart. Each 2 × 2 block sums its four products in two pairs, as `bfmmla` does (its sums
/// are rounded otherwise: the tests compare with a tolerance).
///
/// # Safety
/// Every element of `a` and `c` is readable (and writable); `b` holds `a.cols() / 2` quads.
pub(super) unsafe fn kernel_emulated(a: MatRef<u32>, b: *const u32, c: MatMut<f32>, load_c: bool) {
    let (mv, nv, quads, lda) = (c.rows(), c.cols(), a.cols() / 2, a.stride());
    let bf = |w: u32, hi: bool| f32::from_bits(if hi { w & 0xffff_0000 } else { w << 16 });
    let mut acc = [[0f32; NT]; MR];
    for q in 0..quads {
        for (r, acc) in acc.iter_mut().enumerate().take(mv) {
            // SAFETY: row r of A holds a.cols() = 2 · quads words.
            let aw = unsafe { [*a.ptr().add(r * lda + 2 * q), *a.ptr().add(r * lda + 2 * q + 1)] };
            for (col, acc) in acc.iter_mut().enumerate() {
                // SAFETY: quad q's words of this tile's four column pairs, 16 of them.
                let bw = unsafe { std::slice::from_raw_parts(b.add(q * QUAD + 4 * (col / 2) + 2 * (col % 2)), 2) };
                let dot = |i: usize| bf(aw[i], false) * bf(bw[i], false) + bf(aw[i], true) * bf(bw[i], true);
                *acc += dot(0) + dot(1);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate().take(mv) {
        // SAFETY: row r of C holds nv writable floats.
        let cr = unsafe { std::slice::from_raw_parts_mut(c.row(r), nv) };
        for (o, &s) in cr.iter_mut().zip(acc) {
            *o = if load_c { *o + s } else { s };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each quad's two rows of pair words land as column pairs, every word once.
    #[test]
    fn interleave_places_column_pairs() {
        let kps = 4;
        let mut panel: Vec<u32> = (0..(kps * NR) as u32).collect();
        interleave(&mut panel, kps);
        for q in 0..kps / 2 {
            for c in 0..NR {
                for h in 0..2 {
                    let want = ((2 * q + h) * NR + c) as u32;
                    assert_eq!(panel[q * QUAD + 4 * (c / 2) + 2 * (c % 2) + h], want, "q={q} c={c} h={h}");
                }
            }
        }
    }
}
