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
//! int8 (u8 inputs per voxel, s8 weights per output channel, the scheme of `matmul::int8`) on
//! the same loops, with [`INT8_EXTRA`] units of scales after each row and panel, so that the
//! tiles' arguments stay those of f32 and bf16 (`k` counts them):
//! - an input row: its quads (four u8 in a word, the last padded with zeros), then its scale s
//!   and s · z (z its zero point) as f32 bits: x ≈ s · (q − z);
//! - a panel: its quads (four s8 of one output channel in a word), then per channel the tap's
//!   Σ q_w (f32 bits, exact below 2²⁴) and the channel's weight scale s_w (every tap's alike).
//!
//! So a tap adds s · (Σ q · q_w − z · Σ q_w) per row: its int32 sums are turned into f32 once a
//! tap (each tap reads other voxels, with other scales), and the outputs are scaled by s_w once.
//!
//! This file has the layout, the loops and the portable twins of the register tiles (what every
//! machine tests); `avx512.rs` has the tiles on the instructions.

use std::mem::MaybeUninit;

use super::{Neighbours, ABSENT, CENTRE, TAPS};
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

/// A register tile over several taps: `c[r][..nv] = start + Σ_t a[t][r] · B_t` over `k` units,
/// the sums kept in registers across the taps (`b[t]` tap t's panel, `a[t][r]` row r's input at
/// that tap): for rows that share their taps, no pass over the outputs between taps.
///
/// # Safety
/// As [`Tile`] for each tap: `a` and `b` have one entry per tap, each `a[t]` at least `c.len()`
/// rows.
pub type MultiTile<T> = unsafe fn(a: &[[*const T; MR]], b: &[*const T], c: &[*mut f32], k: usize, nv: usize, start: Start);

/// How many times its voxels' own products a group over the union of their taps may take
/// ([`accumulate_grouped`]). On the synthetic checkpoint's rough scene (`moge bench`, an Intel
/// Xeon without AMX, 2026-12-07) a refine step took, at 1.0 (only runs of like taps) / 1.5 /
/// 2.0 / 2.5, f32 3.52-3.68 / 2.97-3.46 / 3.12 / 3.07 s and int8 1.72-1.76 / 1.48 / 1.50 /
/// 1.47 s; on the smooth floor-and-wall scene no difference beyond the noise.
pub const UNION_OVER: f32 = 1.5;

/// Voxels per block of [`Neighbours::by_taps`]: a block's outputs are one chunk of the grouped
/// route.
pub const GROUP_BLOCK: usize = 4096;

/// What a tile's products are added to.
#[derive(Clone, Copy)]
pub enum Start<'a> {
    /// The outputs' values (a tap after the first).
    Add,
    /// The bias, and the residual's rows: the first tap of every row, which writes outputs
    /// never written before (the centre: every voxel has it).
    From { bias: *const f32, residual: Option<&'a [*const f32]> },
}

impl<'a> Start<'a> {
    /// For the rows from h on (a tile done in passes of fewer rows).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn skip(self, h: usize) -> Start<'a> {
        match self {
            Start::From { bias, residual } => Start::From { bias, residual: residual.map(|r| &r[h..]) },
            add => add,
        }
    }
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
    /// `unit(o, &weight[(o·taps + t)·Ci..][..Ci], u)`.
    fn build<W>(weight: &[W], taps: usize, ci: usize, co: usize, k: usize, unit: impl Fn(usize, &[W], usize) -> T) -> Self {
        assert_eq!(weight.len(), co * taps * ci, "row panels: weight of {} for {ci} -> {co}", weight.len());
        let panels = co.div_ceil(NR);
        let mut data = vec![T::default(); taps * panels * k * NR];
        for t in 0..taps {
            for o in 0..co {
                let (p, lane) = (o / NR, o % NR);
                let w = &weight[(o * taps + t) * ci..][..ci];
                let base = (t * panels + p) * k * NR + lane;
                for u in 0..k {
                    data[base + u * NR] = unit(o, w, u);
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
        Self::build(weight, TAPS, ci, co, ci, |_, w, u| w[u])
    }

    /// A linear layer's weight, PyTorch's (out, in), for f32 inputs.
    pub fn linear(weight: &[f32], d_in: usize, d_out: usize) -> Self {
        Self::build(weight, 1, d_in, d_out, d_in, |_, w, u| w[u])
    }
}

impl Panels<u32> {
    /// For bf16 pair words: k = ⌈Ci / 2⌉, the odd channel's partner zero.
    pub fn bf16(weight: &[f32], ci: usize, co: usize) -> Self {
        Self::build(weight, TAPS, ci, co, ci.div_ceil(2), |_, w, u| pair(w[2 * u], w.get(2 * u + 1).copied().unwrap_or(0.0)))
    }

    /// For int8 rows (the module's documentation): from the s8 weight `q` (Co, 27, Ci) and its
    /// scale per output channel; k = ⌈Ci / 4⌉ + [`INT8_EXTRA`].
    pub fn int8(q: &[i8], scale: &[f32], ci: usize, co: usize) -> Self {
        assert_eq!(scale.len(), co, "int8 panels: {} scales for {co} channels", scale.len());
        let quads = ci.div_ceil(4);
        Self::build(q, TAPS, ci, co, quads + INT8_EXTRA, |o, w, u| {
            if u < quads {
                let b = |i: usize| w.get(4 * u + i).map_or(0, |&v| v as u8 as u32);
                b(0) | b(1) << 8 | b(2) << 16 | b(3) << 24
            } else if u == quads {
                (w.iter().map(|&v| v as i32).sum::<i32>() as f32).to_bits()
            } else {
                scale[o].to_bits()
            }
        })
    }
}

/// Units of scales after an int8 row's quads and a panel's (the module's documentation).
pub const INT8_EXTRA: usize = 2;

/// An int8 row (the module's documentation): `x` quantised into `out` (⌈len / 4⌉ quads, then
/// s and s · z) by `route`'s code.
pub fn quantise_int8(route: crate::model::cpu::matmul::int8::Route, x: &[f32], out: &mut [u32]) {
    let quads = out.len() - INT8_EXTRA;
    assert!(x.len().div_ceil(4) == quads, "int8 row: {} values in {quads} quads", x.len());
    let (q, extra) = out.split_at_mut(quads);
    // The pad of the last quad meets zero weights, but is read: no stale bytes.
    if let Some(last) = q.last_mut() {
        *last = 0;
    }
    // SAFETY: u32 words as their bytes (no invalid u8); the words outlive the slice.
    let bytes = unsafe { std::slice::from_raw_parts_mut(q.as_mut_ptr() as *mut u8, 4 * quads) };
    let (s, z) = crate::model::cpu::matmul::int8::quantise_row_on(route, x, &mut bytes[..x.len()]);
    extra[0] = s.to_bits();
    extra[1] = (s * z as f32).to_bits();
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
    // The centre first: it pairs every voxel with itself, in order, so it writes every output
    // once from the bias before any other tap reads one.
    for t in std::iter::once(CENTRE).chain((0..TAPS).filter(|&t| t != CENTRE)) {
        let pairs = nb.pairs_in(t, v0..v0 + n);
        assert!(t != CENTRE || pairs.len() == n, "row tiles: {} centres for {n} voxels", pairs.len());
        debug_assert!(pairs.iter().all(|&(v, s)| (v as usize - v0) < n && (s as usize) < nb.len()));
        // SAFETY: each pair's source is a row of x and its voxel a row of out and of the
        // residual (asserted above), each voxel once in a tap's pairs; the CPU has the tile
        // (the caller's promise).
        unsafe { tap_tiles(tile, w, t, pairs, (xp, op), co, v0, bias, residual) };
    }
}

/// One tap's pairs (v, s), [`MR`] at a time on `tile`, panel by panel (its weights stay in
/// L1/L2 while the tap's rows pass): out row v − v0 (rows of `co` at `op`) gets x row s (rows of
/// `w.k()` units at `xp`) · W_t, the centre's from the bias (and the residual's row v), the
/// other taps' added to what the centre wrote.
///
/// # Safety
/// Each pair's source is a row of x and its voxel a row of out (and of the residual); a voxel
/// at most once in `pairs`; the centre's tiles run before any other tap's; `tile` runs on this
/// CPU.
#[allow(clippy::too_many_arguments)]
unsafe fn tap_tiles<T>(
    tile: Tile<T>,
    w: &Panels<T>,
    t: usize,
    pairs: &[(u32, u32)],
    (xp, op): (*const T, *mut f32),
    co: usize,
    v0: usize,
    bias: &[f32],
    residual: Option<&[f32]>,
) {
    let k = w.k;
    let mut a = [std::ptr::null::<T>(); MR];
    let mut c = [std::ptr::null_mut::<f32>(); MR];
    let mut res = [std::ptr::null::<f32>(); MR];
    for p in 0..w.panels {
        let (b, j0) = (w.panel(t, p), p * NR);
        let nv = (co - j0).min(NR);
        for group in pairs.chunks(MR) {
            for (i, &(v, s)) in group.iter().enumerate() {
                a[i] = xp.wrapping_add(s as usize * k);
                c[i] = op.wrapping_add((v as usize - v0) * co + j0);
                if let Some(r) = residual {
                    res[i] = r.as_ptr().wrapping_add(v as usize * co + j0);
                }
            }
            let g = group.len();
            let start = if t == CENTRE { Start::From { bias: bias[j0..].as_ptr(), residual: residual.map(|_| &res[..g]) } } else { Start::Add };
            // SAFETY: each a[i] is a row of x (k units), each c[i] nv floats of a row of out and
            // res[i] of the residual, distinct rows within a group, written by the centre's
            // tiles before any other tap adds to them; b one panel; the CPU has the tile (the
            // caller's promise).
            unsafe { tile(&a[..g], b.as_ptr(), &c[..g], k, nv, start) };
        }
    }
}

/// As [`accumulate`], for the block of voxels v0..v0 + n (a block of [`GROUP_BLOCK`]) by groups
/// of voxels with the same taps (`Neighbours::by_taps`): each full group of [`MR`] voxels is one
/// tile that sums all their taps in registers and writes their outputs once (`multi`). For few
/// channels, where a tap's products are short (16 pairs at 32 channels) beside reading and
/// writing the outputs around them. The voxels outside such runs (most of them on a rough
/// surface) are taken [`MR`] at a time in that order (so of like taps): as one tile over the
/// union of their taps, a row of zeros where a voxel lacks one, where that takes at most
/// [`UNION_OVER`] times their own products; else tap by tap on `tile`, 12 at a time.
///
/// # Safety
/// `tile` and `multi` run on this CPU.
#[allow(clippy::too_many_arguments)]
pub unsafe fn accumulate_grouped<T: Copy + Default>(
    multi: MultiTile<T>,
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
    assert!(
        v0.is_multiple_of(GROUP_BLOCK)
            && n <= GROUP_BLOCK
            && co.div_ceil(NR) == w.panels
            && out.len() == n * co
            && x.len() == nb.len() * k
            && bias.len() == co
            && residual.is_none_or(|r| r.len() == nb.len() * co),
        "row tiles: {} outputs of {co} from voxel {v0}, {} inputs for {} voxels",
        out.len(),
        x.len(),
        nb.len()
    );
    // This block's voxels, grouped by their taps (each exactly once: `by_taps`).
    let order = nb.by_taps();
    let order = &order[v0..v0 + n];
    let (xp, op) = (x.as_ptr(), out.as_mut_ptr() as *mut f32);
    let mut a = [[std::ptr::null::<T>(); MR]; TAPS];
    let mut b = [std::ptr::null::<T>(); TAPS];
    let mut c = [std::ptr::null_mut::<f32>(); MR];
    let mut res = [std::ptr::null::<f32>(); MR];
    let mut taps = [0usize; TAPS];
    // The input of a voxel at a tap of its group that it lacks.
    let zeros = vec![T::default(); k];
    let mut group_tile = |group: &[(u32, u32)], mask: u32| {
        let g = group.len();
        let nt = group_inputs(nb, group, mask, xp, k, zeros.as_ptr(), &mut a, &mut taps);
        for p in 0..w.panels {
            let j0 = p * NR;
            let nv = (co - j0).min(NR);
            for (bt, &t) in b.iter_mut().zip(&taps[..nt]) {
                *bt = w.panel(t, p).as_ptr();
            }
            for (r, &(_, v)) in group.iter().enumerate() {
                debug_assert!((v as usize) >= v0 && (v as usize) < v0 + n);
                c[r] = op.wrapping_add((v as usize - v0) * co + j0);
                if let Some(rs) = residual {
                    res[r] = rs.as_ptr().wrapping_add(v as usize * co + j0);
                }
            }
            let start = Start::From { bias: bias[j0..].as_ptr(), residual: residual.map(|_| &res[..g]) };
            // SAFETY: each a[t][r] is a row of x (a neighbour of the group's voxel r) or the
            // zeros (k units), each c[r] nv floats of its own row of out (the block's voxels are
            // distinct) and res[r] of the residual, b[t] tap t's panel; the CPU has the tile
            // (the caller's promise).
            unsafe { multi(&a[..nt], &b[..nt], &c[..g], k, nv, start) };
        }
    };
    let mut odd: Vec<(u32, u32)> = vec![];
    let mut i = 0;
    while i < n {
        let mask = order[i].0;
        let g = order[i..].iter().take(MR).take_while(|e| e.0 == mask).count();
        let group = &order[i..i + g];
        i += g;
        if g == MR {
            group_tile(group, mask);
        } else {
            odd.extend_from_slice(group);
        }
    }
    let mut left: Vec<(u32, u32)> = vec![];
    for group in odd.chunks(MR) {
        let union = group.iter().fold(0, |u, e| u | e.0);
        let own: u32 = group.iter().map(|e| e.0.count_ones()).sum();
        if (union.count_ones() as usize * group.len()) as f32 <= UNION_OVER * own as f32 {
            group_tile(group, union);
        } else {
            left.extend_from_slice(group);
        }
    }
    if left.is_empty() {
        return;
    }
    // The voxels left over, tap by tap, the centre first (every voxel has it: it writes their
    // outputs from the bias before another tap adds to them). Their (voxel, source) pairs per
    // tap, from each voxel's own taps (its mask's bits): no scan of every voxel per tap.
    let mut at = [0usize; TAPS + 1];
    for &(mask, _) in &left {
        let mut m = mask;
        while m != 0 {
            at[m.trailing_zeros() as usize + 1] += 1;
            m &= m - 1;
        }
    }
    for t in 0..TAPS {
        at[t + 1] += at[t];
    }
    let mut fill = at;
    let mut pairs = vec![(0u32, 0u32); at[TAPS]];
    for &(mask, v) in &left {
        let (mut m, row) = (mask, nb.of(v as usize));
        while m != 0 {
            let t = m.trailing_zeros() as usize;
            pairs[fill[t]] = (v, row[t]);
            fill[t] += 1;
            m &= m - 1;
        }
    }
    for t in std::iter::once(CENTRE).chain((0..TAPS).filter(|&t| t != CENTRE)) {
        // SAFETY: each pair's source is a row of x (a voxel's mask holds only its present
        // taps), its voxel one of this block's (distinct within a tap); the centre first; the
        // CPU has the tile (the caller's promise).
        unsafe { tap_tiles(tile, w, t, &pairs[at[t]..at[t + 1]], (xp, op), co, v0, bias, residual) };
    }
}

/// The addresses of a group's inputs at each of its taps (`mask`): `a[i][r]` row r's at tap
/// `taps[i]`, `zeros` where the voxel lacks it. Returns the number of taps.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn group_inputs<T>(
    nb: &Neighbours,
    group: &[(u32, u32)],
    mask: u32,
    xp: *const T,
    k: usize,
    zeros: *const T,
    a: &mut [[*const T; MR]],
    taps: &mut [usize; TAPS],
) -> usize {
    let mut nt = 0;
    for t in 0..TAPS {
        if mask & (1 << t) == 0 {
            continue;
        }
        taps[nt] = t;
        for (slot, &(_, v)) in a[nt].iter_mut().zip(group) {
            let s = nb.of(v as usize)[t];
            debug_assert!(s == ABSENT || (s as usize) < nb.len());
            *slot = if s == ABSENT { zeros } else { xp.wrapping_add(s as usize * k) };
        }
        nt += 1;
    }
    nt
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

/// The f32 multi-tap tile in portable code: the twin of `avx512::multi_f32`.
///
/// # Safety
/// As [`MultiTile`].
pub unsafe fn multi_f32_portable(a: &[[*const f32; MR]], b: &[*const f32], c: &[*mut f32], k: usize, nv: usize, start: Start) {
    // SAFETY: the caller's promise.
    unsafe { multi_portable(a, b, c, k, nv, start, |acc, av, bv| acc + av * bv) }
}

/// The bf16 multi-tap tile in portable code: the twin of `avx512::multi_bf16`.
///
/// # Safety
/// As [`MultiTile`].
pub unsafe fn multi_bf16_portable(a: &[[*const u32; MR]], b: &[*const u32], c: &[*mut f32], k: usize, nv: usize, start: Start) {
    let (lo, hi) = (|w: u32| f32::from_bits(w << 16), |w: u32| f32::from_bits(w & 0xffff_0000));
    // SAFETY: the caller's promise.
    unsafe { multi_portable(a, b, c, k, nv, start, |acc, av, bv| acc + lo(av) * lo(bv) + hi(av) * hi(bv)) }
}

/// The int8 tile in portable code: the twin of `avx512::tile_int8`.
///
/// # Safety
/// As [`Tile`], for int8 rows and panels (`k` counts their [`INT8_EXTRA`] units).
pub unsafe fn tile_int8_portable(a: &[*const u32], b: *const u32, c: &[*mut f32], k: usize, nv: usize, start: Start) {
    let at: [*const u32; MR] = std::array::from_fn(|r| a.get(r).copied().unwrap_or(std::ptr::null()));
    // SAFETY: the caller's promise, for one tap.
    unsafe { multi_int8_portable(&[at], &[b], c, k, nv, start) }
}

/// The int8 multi-tap tile in portable code: the twin of `avx512::multi_int8`.
///
/// # Safety
/// As [`MultiTile`], for int8 rows and panels (`k` counts their [`INT8_EXTRA`] units).
pub unsafe fn multi_int8_portable(a: &[[*const u32; MR]], b: &[*const u32], c: &[*mut f32], k: usize, nv: usize, start: Start) {
    debug_assert!(a.len() == b.len() && c.len() <= MR && nv <= NR && k >= INT8_EXTRA);
    let quads = k - INT8_EXTRA;
    let dot = |x: u32, w: u32| (0..4).map(|i| (x >> (8 * i)) as u8 as i32 * (w >> (8 * i)) as u8 as i8 as i32).sum::<i32>();
    for (r, &cr) in c.iter().enumerate() {
        let mut acc = [0f32; NR];
        for (at, &bt) in a.iter().zip(b) {
            // SAFETY: the caller's promise: row r's input at this tap holds k units, its panel
            // k · NR.
            let (ar, bt) = unsafe { (std::slice::from_raw_parts(at[r], k), std::slice::from_raw_parts(bt, k * NR)) };
            let mut sums = [0i32; NR];
            for (&av, bu) in ar[..quads].iter().zip(bt.chunks_exact(NR)) {
                for (s, &bv) in sums.iter_mut().zip(bu) {
                    *s += dot(av, bv);
                }
            }
            let (s, sz) = (f32::from_bits(ar[quads]), f32::from_bits(ar[quads + 1]));
            for ((acc, &sum), &w) in acc.iter_mut().zip(&sums).zip(&bt[quads * NR..][..NR]) {
                *acc += s * sum as f32 - sz * f32::from_bits(w);
            }
        }
        // SAFETY: as above, for tap 0's panel (every tap holds the weight scales).
        let sw = unsafe { std::slice::from_raw_parts(b[0].add((quads + 1) * NR), NR) };
        acc.iter_mut().zip(sw).for_each(|(a, &w)| *a *= f32::from_bits(w));
        // SAFETY: the caller's promise: c[r], the bias and the residual's row r hold nv floats.
        unsafe { finish(&acc, r, cr, nv, start) };
    }
}

/// # Safety
/// As [`MultiTile`].
unsafe fn multi_portable<T: Copy>(a: &[[*const T; MR]], b: &[*const T], c: &[*mut f32], k: usize, nv: usize, start: Start, madd: impl Fn(f32, T, T) -> f32) {
    debug_assert!(a.len() == b.len() && c.len() <= MR && nv <= NR);
    for (r, &cr) in c.iter().enumerate() {
        let mut acc = [0f32; NR];
        for (at, &bt) in a.iter().zip(b) {
            // SAFETY: the caller's promise: row r's input at this tap holds k units, its panel
            // k · NR.
            let (ar, bt) = unsafe { (std::slice::from_raw_parts(at[r], k), std::slice::from_raw_parts(bt, k * NR)) };
            for (&av, bu) in ar.iter().zip(bt.chunks_exact(NR)) {
                for (s, &bv) in acc.iter_mut().zip(bu) {
                    *s = madd(*s, av, bv);
                }
            }
        }
        // SAFETY: the caller's promise: c[r], the bias and the residual's row r hold nv floats.
        unsafe { finish(&acc, r, cr, nv, start) };
    }
}

/// `cr[..nv] = start + acc` for row r.
///
/// # Safety
/// As [`Tile`], for row r.
unsafe fn finish(acc: &[f32; NR], r: usize, cr: *mut f32, nv: usize, start: Start) {
    for (j, s) in acc.iter().enumerate().take(nv) {
        // SAFETY: column j < nv of row r, of the bias and of the residual's row r.
        unsafe {
            let o = cr.add(j);
            *o = match start {
                Start::Add => *o + s,
                Start::From { bias, residual } => s + *bias.add(j) + residual.map_or(0.0, |res| *res[r].add(j)),
            };
        }
    }
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
        // SAFETY: as above.
        unsafe { finish(&acc, r, cr, nv, start) };
    }
}
