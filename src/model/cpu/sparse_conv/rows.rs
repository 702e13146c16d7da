//! The row tiles of the submanifold convolution: each tap's products read every voxel's inputs
//! where they lie and add into every voxel's outputs where they lie, by address. No gathered
//! copy of the inputs, no block of products to add back into their rows: the register tile
//! takes up to [`MR`] input rows and [`MR`] output rows as pointers (the pairs of one tap).
//!
//! The operands:
//! - inputs as rows of `k` units: f32 values, or bf16 pair words `bf16(x[2i]) | bf16(x[2i+1])
//!   << 16` (`matmul::bf16`'s layout, converted once a call);
//! - each tap's weight as panels of [`NR`] output channels: per unit, the panel's NR values side
//!   by side (zero past Co and past the k values), so that the tile never needs a tail in k and
//!   masks only its stores.
//!
//! This file has the layout, the loops and the portable twins of the register tiles (what every
//! machine tests); `avx512.rs` has the tiles on the instructions.

use std::mem::MaybeUninit;

use super::{Neighbours, CENTRE, TAPS};
use crate::model::cpu::matmul::bf16::pair;

/// Rows of a register tile: 12 rows × 2 zmm of accumulators (as `matmul::bf16`'s tile).
pub const MR: usize = 12;
/// Output channels of a register tile and of a weight panel.
pub const NR: usize = 32;

/// A register tile: `c[r][..nv] = start + a[r] · B` over `k` units, for each of the (≤ [`MR`])
/// rows, B one panel (`k` · NR values).
///
/// # Safety
/// `a` and `c` have the same length ≤ MR (and `start`'s residual rows too); each `a[r]` points
/// to `k` readable units, each `c[r]` to `nv` ≤ NR writable floats (readable where `start` is
/// [`Start::Add`]) that no other row of `c` overlaps, each residual row and the bias to `nv`
/// readable floats; `b` to `k` · NR readable units; the CPU has the tile's instructions.
pub type Tile<T> = unsafe fn(a: &[*const T], b: *const T, c: &[*mut f32], k: usize, nv: usize, start: Start);

/// What a tile's products are added to.
#[derive(Clone, Copy)]
pub enum Start<'a> {
    /// The outputs' values (a tap after the first).
    Add,
    /// The bias, and the residual's rows: the first tap of every row, which writes outputs
    /// never written before (the centre: every voxel has it).
    From { bias: *const f32, residual: Option<&'a [*const f32]> },
}

/// The taps' weights as panels (module documentation): the 27 of a convolution, or the one of
/// a linear layer.
pub struct Panels<T> {
    data: Vec<T>,
    /// Units per input row.
    k: usize,
    panels: usize,
}

impl<T: Copy + Default> Panels<T> {
    /// From a weight (Co, taps, Ci) (upstream's convolution weight, or a linear's (out, in)
    /// with one tap): unit u of output channel o at tap t is
    /// `unit(&weight[(o·taps + t)·Ci..][..Ci], u)`.
    fn build(weight: &[f32], taps: usize, ci: usize, co: usize, k: usize, unit: impl Fn(&[f32], usize) -> T) -> Self {
        assert_eq!(weight.len(), co * taps * ci, "row panels: weight of {} for {ci} -> {co}", weight.len());
        let panels = co.div_ceil(NR);
        let mut data = vec![T::default(); taps * panels * k * NR];
        for t in 0..taps {
            for o in 0..co {
                let (p, lane) = (o / NR, o % NR);
                let w = &weight[(o * taps + t) * ci..][..ci];
                let base = (t * panels + p) * k * NR + lane;
                for u in 0..k {
                    data[base + u * NR] = unit(w, u);
                }
            }
        }
        Self { data, k, panels }
    }
}

impl<T> Panels<T> {
    /// Units per input row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Panel `p` of tap `t`.
    fn panel(&self, t: usize, p: usize) -> &[T] {
        &self.data[(t * self.panels + p) * self.k * NR..][..self.k * NR]
    }
}

impl Panels<f32> {
    /// For f32 inputs: k = Ci.
    pub fn f32(weight: &[f32], ci: usize, co: usize) -> Self {
        Self::build(weight, TAPS, ci, co, ci, |w, u| w[u])
    }

    /// A linear layer's weight, PyTorch's (out, in), for f32 inputs.
    pub fn linear(weight: &[f32], d_in: usize, d_out: usize) -> Self {
        Self::build(weight, 1, d_in, d_out, d_in, |w, u| w[u])
    }
}

impl Panels<u32> {
    /// For bf16 pair words: k = ⌈Ci / 2⌉, the odd channel's partner zero.
    pub fn bf16(weight: &[f32], ci: usize, co: usize) -> Self {
        Self::build(weight, TAPS, ci, co, ci.div_ceil(2), |w, u| pair(w[2 * u], w.get(2 * u + 1).copied().unwrap_or(0.0)))
    }
}

/// `out` (the n rows of `co` of voxels v0..v0 + n) = bias [+ residual] + Σ over taps t and their
/// pairs (v, s) of those voxels: x row s · W_t, on `tile`. `x` holds every voxel's row of
/// `w.k()` units, `residual` (where given) every voxel's row of `co`. Every element of `out` is
/// written (it need not be initialised).
///
/// # Safety
/// `tile` runs on this CPU.
#[allow(clippy::too_many_arguments)]
pub unsafe fn accumulate<T>(
    tile: Tile<T>,
    w: &Panels<T>,
    x: &[T],
    out: &mut [MaybeUninit<f32>],
    co: usize,
    nb: &Neighbours,
    v0: usize,
    bias: &[f32],
    residual: Option<&[f32]>,
) {
    let k = w.k;
    let n = out.len() / co.max(1);
    // Every pair's addresses in bounds: its source below nb.len() (`Neighbours::from_map`),
    // which x holds, its voxel in v0..v0 + n (`pairs_in`), which out holds (and the residual).
    assert!(
        co.div_ceil(NR) == w.panels && out.len() == n * co && x.len() == nb.len() * k && bias.len() == co && residual.is_none_or(|r| r.len() == nb.len() * co),
        "row tiles: {} outputs of {co}, {} inputs for {} voxels",
        out.len(),
        x.len(),
        nb.len()
    );
    let (xp, op) = (x.as_ptr(), out.as_mut_ptr() as *mut f32);
    let mut a = [std::ptr::null::<T>(); MR];
    let mut c = [std::ptr::null_mut::<f32>(); MR];
    let mut res = [std::ptr::null::<f32>(); MR];
    // The centre first: it pairs every voxel with itself, in order, so it writes every output
    // once from the bias before any other tap reads one.
    for t in std::iter::once(CENTRE).chain((0..TAPS).filter(|&t| t != CENTRE)) {
        let pairs = nb.pairs_in(t, v0..v0 + n);
        assert!(t != CENTRE || pairs.len() == n, "row tiles: {} centres for {n} voxels", pairs.len());
        // Panel outer: its weights stay in L1/L2 while the tap's rows pass.
        for p in 0..w.panels {
            let (b, j0) = (w.panel(t, p), p * NR);
            let nv = (co - j0).min(NR);
            for group in pairs.chunks(MR) {
                for (i, &(v, s)) in group.iter().enumerate() {
                    debug_assert!((v as usize - v0) < n && (s as usize) < nb.len());
                    a[i] = xp.wrapping_add(s as usize * k);
                    c[i] = op.wrapping_add((v as usize - v0) * co + j0);
                    if let Some(r) = residual {
                        res[i] = r.as_ptr().wrapping_add(v as usize * co + j0);
                    }
                }
                let g = group.len();
                let start = if t == CENTRE { Start::From { bias: bias[j0..].as_ptr(), residual: residual.map(|_| &res[..g]) } } else { Start::Add };
                // SAFETY: each a[i] is a row of x (k units), each c[i] nv floats of a row of out
                // and res[i] of the residual (asserted above), distinct rows within a group (a
                // tap pairs each voxel once), written by the centre's tiles before any other tap
                // adds to them; b one panel; the CPU has the tile (the caller's promise).
                unsafe { tile(&a[..g], b.as_ptr(), &c[..g], k, nv, start) };
            }
        }
    }
}

/// `out` (n rows of `co`) = bias + x (n rows of `w.k()`) · W for a one-tap `w` (a linear
/// layer), on `tile`; every element of `out` written.
///
/// # Safety
/// `tile` runs on this CPU.
pub unsafe fn dense<T>(tile: Tile<T>, w: &Panels<T>, x: &[T], out: &mut [MaybeUninit<f32>], co: usize, bias: &[f32]) {
    let (k, n) = (w.k, out.len() / co.max(1));
    assert!(
        co.div_ceil(NR) == w.panels && w.data.len() == w.panels * k * NR && out.len() == n * co && x.len() == n * k && bias.len() == co,
        "row tiles: a linear of {} outputs of {co} for {} inputs",
        out.len(),
        x.len()
    );
    let (xp, op) = (x.as_ptr(), out.as_mut_ptr() as *mut f32);
    for p in 0..w.panels {
        let (b, j0) = (w.panel(0, p), p * NR);
        let nv = (co - j0).min(NR);
        for r0 in (0..n).step_by(MR) {
            let g = (n - r0).min(MR);
            let a: [*const T; MR] = std::array::from_fn(|i| xp.wrapping_add((r0 + i) * k));
            let c: [*mut f32; MR] = std::array::from_fn(|i| op.wrapping_add((r0 + i) * co + j0));
            // SAFETY: rows r0..r0 + g of x (k units each) and of out (nv floats from j0), all
            // inside them (asserted above); b one panel, the bias nv floats from j0; the CPU has
            // the tile (the caller's promise).
            unsafe { tile(&a[..g], b.as_ptr(), &c[..g], k, nv, Start::From { bias: bias[j0..].as_ptr(), residual: None }) };
        }
    }
}

/// The f32 tile in portable code: the twin of `avx512::tile_f32` (a multiply and an add where
/// it fuses them).
///
/// # Safety
/// As [`Tile`].
pub unsafe fn tile_f32_portable(a: &[*const f32], b: *const f32, c: &[*mut f32], k: usize, nv: usize, start: Start) {
    // SAFETY: the caller's promise.
    unsafe { portable(a, b, c, k, nv, start, |acc, av, bv| acc + av * bv) }
}

/// The bf16 tile in portable code: the twin of `avx512::tile_bf16` (`vdpbf16ps`: both halves'
/// products added in f32).
///
/// # Safety
/// As [`Tile`].
pub unsafe fn tile_bf16_portable(a: &[*const u32], b: *const u32, c: &[*mut f32], k: usize, nv: usize, start: Start) {
    let (lo, hi) = (|w: u32| f32::from_bits(w << 16), |w: u32| f32::from_bits(w & 0xffff_0000));
    // SAFETY: the caller's promise.
    unsafe { portable(a, b, c, k, nv, start, |acc, av, bv| acc + lo(av) * lo(bv) + hi(av) * hi(bv)) }
}

/// # Safety
/// As [`Tile`].
unsafe fn portable<T: Copy>(a: &[*const T], b: *const T, c: &[*mut f32], k: usize, nv: usize, start: Start, madd: impl Fn(f32, T, T) -> f32) {
    debug_assert!(a.len() == c.len() && a.len() <= MR && nv <= NR);
    // SAFETY: the caller's promise: a[r] holds k units, b k · NR, c[r] nv floats (and the
    // bias and residual rows).
    let b = unsafe { std::slice::from_raw_parts(b, k * NR) };
    for (r, (&ar, &cr)) in a.iter().zip(c).enumerate() {
        // SAFETY: as above, for row r.
        let ar = unsafe { std::slice::from_raw_parts(ar, k) };
        let mut acc = [0f32; NR];
        for (&av, bu) in ar.iter().zip(b.chunks_exact(NR)) {
            for (s, &bv) in acc.iter_mut().zip(bu) {
                *s = madd(*s, av, bv);
            }
        }
        for (j, s) in acc.iter().enumerate().take(nv) {
            // SAFETY: as above: column j < nv of row r, of the bias and of the residual's row r.
            unsafe {
                let o = cr.add(j);
                *o = match start {
                    Start::Add => *o + s,
                    Start::From { bias, residual } => s + *bias.add(j) + residual.map_or(0.0, |res| *res[r].add(j)),
                };
            }
        }
    }
}
