//! The submanifold convolution on AMX tiles, output-stationary by groups of voxels.
//!
//! The voxels go in blocks of [`BLOCK_VOXELS`], each sorted by its taps (voxels with the same
//! or nearly the same taps side by side), [`GROUP`] at a time ([`Groups`], made once a level).
//! For each tap in the union of a group's taps, the group's neighbour rows (bf16 pairs) are
//! gathered into a block on cache lines, a zero row where a voxel lacks that tap. Then, per 32
//! output channels, four accumulator tiles (32 voxels × 32 channels) sum every tap and every
//! pair of input channels in the tile registers, and each output is written once, from the bias
//! and the residual. No block of products is stored and added back into its rows, as the
//! gathered products do (`SubmConv3d::forward_fused`), which left the tiles idle most of the
//! time at the refiner's widths.
//!
//! The zero rows cost multiply-adds: on the floor-and-wall scene of `examples/sparse_conv_bench`,
//! 32 voxels sorted by taps in blocks of 1024 have 9-24 % more taps in their union than of their
//! own by level (in blocks of 4096, 4-18 %; in the voxels' order, 60-80 %); on rough surfaces
//! more. Smaller blocks keep a block's rows (neighbour map, outputs) in L2 while the sorted
//! order visits them out of order.
//!
//! Each group reads every weight of its taps: up to [`super::TILES_MAX_CI`] channels; beyond,
//! the gathered products, whose tap products run over thousands of rows, read each weight once
//! a chunk.
//!
//! Written against [`TileUnit`]: the hardware on the `amx` level, the emulation in the tests.

use std::mem::MaybeUninit;

use super::{Neighbours, ABSENT, TAPS};
use crate::model::cpu::matmul::bf16::pair;
use crate::simd::tiles::{TileUnit, ROWS, ROW_BYTES};
use crate::simd::Lines;

/// Voxels of a group: the rows of two A tiles.
pub const GROUP: usize = 2 * ROWS;
/// Pair words of a tile row (32 input channels).
const KW: usize = ROW_BYTES / 4;
/// Output channels of a tile (f32 columns).
const COLS: usize = ROW_BYTES / 4;
/// Output channels of four accumulator tiles (two B tiles side by side).
const BLOCK: usize = 2 * COLS;

/// The taps' weights as B tiles: for tap t, step s of [`KW`] pair words and tile j of
/// [`COLS`] output channels, 16 rows (a pair of input channels each) of 16 columns, zero past
/// Ci and Co.
pub struct TileTaps {
    b: Lines<u32>,
    /// Pair words per input row: Ci in pairs, up to a multiple of [`KW`].
    kw: usize,
    /// Column tiles: Co in [`COLS`], up to an even count.
    ct: usize,
    /// The tile operations emulated (the tests' route on any machine; the only one off x86-64).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    emulated: bool,
}

impl TileTaps {
    /// From upstream's weight (Co, 27, Ci).
    pub fn new(weight: &[f32], ci: usize, co: usize, emulated: bool) -> Self {
        assert_eq!(weight.len(), co * TAPS * ci, "sparse tiles: weight of {} for {ci} -> {co}", weight.len());
        let kw = ci.div_ceil(2 * KW) * KW;
        let ct = co.div_ceil(BLOCK) * 2;
        let steps = kw / KW;
        let mut b = Lines::zeros(TAPS * steps * ct * KW * COLS);
        let w = |o: usize, t: usize, i: usize| if i < ci { weight[(o * TAPS + t) * ci + i] } else { 0.0 };
        for t in 0..TAPS {
            for s in 0..steps {
                for j in 0..ct {
                    let base = ((t * steps + s) * ct + j) * KW * COLS;
                    for p in 0..KW {
                        let i = 2 * (s * KW + p);
                        for n in (0..COLS).take_while(|n| j * COLS + n < co) {
                            let o = j * COLS + n;
                            b[base + p * COLS + n] = pair(w(o, t, i), w(o, t, i + 1));
                        }
                    }
                }
            }
        }
        Self { b, kw, ct, emulated }
    }

    /// Pair words per input row.
    pub fn kw(&self) -> usize {
        self.kw
    }

    /// The B tile of tap t, step s, column tile j.
    fn tile(&self, t: usize, s: usize, j: usize) -> *const u8 {
        let steps = self.kw / KW;
        self.b[((t * steps + s) * self.ct + j) * KW * COLS..][..KW * COLS].as_ptr() as *const u8
    }

    /// One chunk's outputs: voxels v0..v0 + n, a block of [`Groups`] (v0 a multiple of
    /// [`BLOCK_VOXELS`]), from `words` (every voxel's input as `kw` pair words), each output
    /// written once.
    ///
    /// # Safety
    /// `out` is the chunk's n rows of `co`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn accumulate(
        &self,
        words: &[u32],
        out: &mut [MaybeUninit<f32>],
        co: usize,
        nb: &Neighbours,
        v0: usize,
        bias: &[f32],
        residual: Option<&[f32]>,
    ) {
        thread_local! {
            static GATHERED: std::cell::RefCell<Lines<u32>> = Default::default();
        }
        crate::simd::with_local(&GATHERED, |g| {
            #[cfg(target_arch = "x86_64")]
            if !self.emulated {
                let mut unit = crate::simd::amx::Amx::new().expect("sparse tiles on a CPU without usable AMX");
                // SAFETY: the caller's promise, passed on; the tiles are usable (`Amx::new`).
                unsafe { self.chunk(&mut unit, g, words, out, co, nb, v0, bias, residual) };
                return;
            }
            // SAFETY: as above.
            unsafe { self.chunk(&mut crate::simd::tiles::Emulated::default(), g, words, out, co, nb, v0, bias, residual) };
        })
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn chunk<U: TileUnit>(
        &self,
        unit: &mut U,
        g: &mut Lines<u32>,
        words: &[u32],
        out: &mut [MaybeUninit<f32>],
        co: usize,
        nb: &Neighbours,
        v0: usize,
        bias: &[f32],
        residual: Option<&[f32]>,
    ) {
        let kw = self.kw;
        let n = out.len() / co;
        assert!(words.len() >= nb.len() * kw && bias.len() >= co && v0 + n <= nb.len(), "sparse tiles: shapes");
        if g.len() < TAPS * GROUP * kw {
            *g = Lines::zeros(TAPS * GROUP * kw);
        }
        // The four accumulators' values, 32 rows of 32.
        let mut c = Lines::<f32>::zeros(GROUP * BLOCK);
        let groups = nb.tile_groups();
        let (first, last) = groups.of_block(v0 / BLOCK_VOXELS);
        assert!(v0.is_multiple_of(BLOCK_VOXELS) && (last - first) * GROUP >= n, "sparse tiles: a chunk off the blocks");
        for gi in first..last {
            if let Some(next) = groups.get(gi + 1).filter(|_| gi + 1 < last) {
                prefetch_next(&next, words, kw, out[..].as_ptr() as *const f32, v0, co);
            }
            let group = groups.get(gi).expect("a group of the block");
            gather_rows(U::AVX512, &mut g[..group.srcs.len() * kw], group.srcs, words, kw);
            let steps = kw / KW;
            let stride = kw * 4;
            for block in 0..self.ct / 2 {
                unit.zero::<0>();
                unit.zero::<1>();
                unit.zero::<2>();
                unit.zero::<3>();
                for (i, t) in group.taps().enumerate() {
                    for s in 0..steps {
                        let a = g[i * GROUP * kw + s * KW..].as_ptr() as *const u8;
                        // SAFETY: 16 rows of 64 bytes, `stride` apart, of the gathered block
                        // (tap i's 32 rows of kw words, kw ≥ (s + 1) · KW), and the two B tiles
                        // of 1 KiB in `b` (`tile`).
                        unsafe {
                            unit.load::<4>(a, stride);
                            unit.load::<5>(a.add(ROWS * stride), stride);
                            unit.load::<6>(self.tile(t, s, 2 * block), ROW_BYTES);
                            unit.load::<7>(self.tile(t, s, 2 * block + 1), ROW_BYTES);
                        }
                        unit.dp_bf16::<0, 4, 6>();
                        unit.dp_bf16::<1, 4, 7>();
                        unit.dp_bf16::<2, 5, 6>();
                        unit.dp_bf16::<3, 5, 7>();
                    }
                }
                let cp = c.as_mut_ptr() as *mut u8;
                let row = BLOCK * 4;
                // SAFETY: `c` is 32 rows of 32 f32 (128 bytes): each tile's 16 rows of 64 bytes.
                unsafe {
                    unit.store::<0>(cp, row);
                    unit.store::<1>(cp.add(ROW_BYTES), row);
                    unit.store::<2>(cp.add(ROWS * row), row);
                    unit.store::<3>(cp.add(ROWS * row + ROW_BYTES), row);
                }
                let o0 = block * BLOCK;
                let nv = co.saturating_sub(o0).min(BLOCK);
                finish_rows(U::AVX512, out, (v0, co, o0, nv), group.voxels, &c, &bias[o0..o0 + nv], residual);
            }
        }
    }
}

/// Asks for the next group's input rows and output rows before its turn: the sorted order
/// visits a block's voxels out of the order the hardware's prefetchers follow.
fn prefetch_next(next: &Group, words: &[u32], kw: usize, out: *const f32, v0: usize, co: usize) {
    for &src in next.srcs.iter().filter(|&&s| s != ABSENT) {
        let row = words.as_ptr().wrapping_add(src as usize * kw);
        (0..kw).step_by(16).for_each(|w| prefetch(row.wrapping_add(w)));
    }
    for &v in next.voxels.iter().filter(|&&v| v != ABSENT) {
        let row = out.wrapping_add((v as usize - v0) * co);
        (0..co).step_by(16).for_each(|o| prefetch(row.wrapping_add(o)));
    }
}

/// A hint to bring the cache line at `p` into L1.
#[inline(always)]
fn prefetch<T>(p: *const T) {
    // SAFETY: a prefetch reads nothing into the program and cannot fault, at any address.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Row i of `dst` (rows of `kw` words, a multiple of 16) = row `srcs[i]` of `words`, or zeros
/// where it is [`ABSENT`].
fn gather_rows(avx512: bool, dst: &mut [u32], srcs: &[u32], words: &[u32], kw: usize) {
    assert!(
        kw.is_multiple_of(16) && dst.len() == srcs.len() * kw && srcs.iter().all(|&s| s == ABSENT || (s as usize + 1) * kw <= words.len()),
        "sparse tiles: rows to gather"
    );
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        // SAFETY: `avx512` is `TileUnit::AVX512`: this CPU has AVX-512F; `dst` holds the rows,
        // and each source row is inside `words` (asserted).
        unsafe { super::avx512::gather_rows(dst.as_mut_ptr(), srcs, words.as_ptr(), kw) };
        return;
    }
    let _ = avx512;
    for (d, &s) in dst.chunks_exact_mut(kw).zip(srcs) {
        match s {
            ABSENT => d.fill(0),
            s => d.copy_from_slice(&words[s as usize * kw..][..kw]),
        }
    }
}

/// For each voxel v of `voxels` (row r of `c`, rows of [`BLOCK`]; [`ABSENT`]: none), its outputs
/// o0..o0 + nv in `out` (the rows of voxels v0.., `co` each) = c + bias [+ its residual's].
#[allow(clippy::too_many_arguments)]
fn finish_rows(
    avx512: bool,
    out: &mut [MaybeUninit<f32>],
    (v0, co, o0, nv): (usize, usize, usize, usize),
    voxels: &[u32],
    c: &[f32],
    bias: &[f32],
    residual: Option<&[f32]>,
) {
    let rows = out.len() / co;
    assert!(
        o0 + nv <= co
            && nv <= BLOCK
            && bias.len() == nv
            && c.len() >= voxels.len() * BLOCK
            && voxels.iter().all(|&v| v == ABSENT || (v as usize >= v0 && v as usize - v0 < rows && residual.is_none_or(|r| (v as usize + 1) * co <= r.len()))),
        "sparse tiles: rows of outputs"
    );
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        let res = residual.map_or(std::ptr::null(), <[f32]>::as_ptr);
        // SAFETY: as `gather_rows`; each voxel's row of outputs and of the residual is inside
        // `out` and `residual` (asserted), nv ≤ 32.
        unsafe { super::avx512::finish_rows(out.as_mut_ptr() as *mut f32, (v0, co, o0, nv), voxels, c.as_ptr(), bias.as_ptr(), res) };
        return;
    }
    let _ = avx512;
    for (r, &v) in voxels.iter().enumerate().filter(|(_, &v)| v != ABSENT) {
        let v = v as usize;
        for (i, d) in out[(v - v0) * co + o0..][..nv].iter_mut().enumerate() {
            d.write(c[r * BLOCK + i] + bias[i] + residual.map_or(0.0, |res| res[v * co + o0 + i]));
        }
    }
}

/// Voxels per block of [`Groups`]: a chunk of the AMX route's outputs.
pub const BLOCK_VOXELS: usize = 1024;

/// The AMX route's groups of a level (`Neighbours::tile_groups`): each block of
/// [`BLOCK_VOXELS`] voxels sorted by their taps (as bits), then cut into groups of [`GROUP`];
/// per group its voxels, the union of their taps, and per tap of the union the 32 rows to
/// gather (the neighbours there, [`ABSENT`] for a zero row). Read in order by every convolution
/// of the level: no lookup in the neighbour map while the tiles wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Groups {
    /// Per group: where its rows start in `srcs`, and its taps in `taps`.
    heads: Vec<(usize, usize)>,
    /// Per group, its taps (the union of its voxels'), ascending.
    taps: Vec<u8>,
    /// [`GROUP`] voxels per group, [`ABSENT`] past the last.
    voxels: Vec<u32>,
    srcs: Vec<u32>,
    /// Per block, its first group (and a last entry, the group count).
    blocks: Vec<usize>,
}

impl Group<'_> {
    /// Its taps (the union of its voxels'), ascending.
    pub fn taps(&self) -> impl Iterator<Item = usize> + '_ {
        self.taps.iter().map(|&t| t as usize)
    }
}

/// One group of [`Groups`].
pub struct Group<'a> {
    /// Its taps (the union of its voxels'), ascending.
    taps: &'a [u8],
    /// Its voxels, [`ABSENT`] past the last.
    pub voxels: &'a [u32],
    /// Per tap of `taps`, the [`GROUP`] rows to gather ([`ABSENT`]: zeros).
    pub srcs: &'a [u32],
}

impl Groups {
    pub fn new(nb: &Neighbours) -> Self {
        use rayon::prelude::*;
        let blocks: Vec<Groups> = (0..nb.len().div_ceil(BLOCK_VOXELS)).into_par_iter().map(|b| Self::block(nb, b)).collect();
        let mut all = Groups { heads: vec![], taps: vec![], voxels: vec![], srcs: vec![], blocks: vec![0] };
        for block in blocks {
            let (at, tap) = (all.srcs.len(), all.taps.len());
            all.heads.extend(block.heads.into_iter().map(|(a, t)| (at + a, tap + t)));
            all.taps.extend(block.taps);
            all.voxels.extend(block.voxels);
            all.srcs.extend(block.srcs);
            all.blocks.push(all.heads.len());
        }
        all
    }

    /// Block b's groups alone.
    fn block(nb: &Neighbours, b: usize) -> Groups {
        let vs = b * BLOCK_VOXELS..((b + 1) * BLOCK_VOXELS).min(nb.len());
        let mask = |v: usize| nb.of(v).iter().enumerate().fold(0u32, |m, (t, &s)| m | u32::from(s != ABSENT) << t);
        let mut order: Vec<(u32, u32)> = vs.map(|v| (mask(v), v as u32)).collect();
        order.sort_unstable();
        let mut out = Groups { heads: vec![], taps: vec![], voxels: vec![], srcs: vec![], blocks: vec![0] };
        for group in order.chunks(GROUP) {
            let union = group.iter().fold(0u32, |a, e| a | e.0);
            out.heads.push((out.srcs.len(), out.taps.len()));
            out.voxels.extend((0..GROUP).map(|r| group.get(r).map_or(ABSENT, |e| e.1)));
            for t in (0..TAPS).filter(|t| union >> t & 1 == 1) {
                out.taps.push(t as u8);
                out.srcs.extend((0..GROUP).map(|r| group.get(r).map_or(ABSENT, |e| nb.of(e.1 as usize)[t])));
            }
        }
        out.blocks.push(out.heads.len());
        out
    }

    /// Groups first..last of block b.
    pub fn of_block(&self, b: usize) -> (usize, usize) {
        (self.blocks[b], self.blocks[b + 1])
    }

    /// Group i.
    pub fn get(&self, i: usize) -> Option<Group<'_>> {
        let &(at, tap) = self.heads.get(i)?;
        let &(_, end) = self.heads.get(i + 1).unwrap_or(&(0, self.taps.len()));
        let taps = &self.taps[tap..end];
        let srcs = &self.srcs[at..at + taps.len() * GROUP];
        Some(Group { taps, voxels: &self.voxels[i * GROUP..(i + 1) * GROUP], srcs })
    }
}
