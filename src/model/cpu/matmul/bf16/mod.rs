//! BF16 matrix multiply with f32 accumulation, for the GEMM-bound layers (no Rust crate has a
//! bf16 GEMM, and `vdpbf16ps` retires 2× the multiply-adds of f32 FMA). Measured on an AMD
//! EPYC family 26 (Zen 5, full-width AVX-512): `vdpbf16ps` ≈ 420 GFLOP/s per core with ≥ 24
//! independent chains (≈ 250 with 8, which is latency-bound), zmm f32 FMA ≈ 190; the `gemm`
//! crate (AVX2 kernels) ≈ 120.
//!
//! `C (M×N, f32) = [C +] A (M×K) · B (K×N)`, inputs rounded to bf16 (round-to-nearest-even),
//! products summed in f32. One operand is pre-packed once (the weights), the other is f32 and
//! converted on the fly, on every call:
//! * [`gemm_bf16`]: A = f32 activations (tokens × K), B = [`PackedB`] (Linear weights).
//! * [`gemm_bf16_packed_a`]: A = [`PackedA`] (conv weights, cout × cin·9), B = f32 (im2col).
//!
//! Fast path (AVX512-BF16): a 12×32 register-blocked microkernel. Per k pair (k, k+1) it
//! broadcasts one u32 = two bf16 from each of the 12 rows of A, loads 32 columns × one pair of
//! B as two zmm, and issues 24 `vdpbf16ps` (16 lanes × 2 multiply-adds each). Word layout
//! everywhere: `bf16(x[k]) | bf16(x[k+1]) << 16`, K padded to even with a zero.
//! * A: rows of pairs, row-major (no transposition: the kernel reads 12 row streams), so
//!   converting A per call is a straight vector conversion.
//! * B: panels of NR = 32 columns; within a panel, for each k pair, the 32 columns' words
//!   side by side (the two zmm the kernel loads).
//!
//! Tiles (AMX, [`Isa::Amx`]): the same layouts, k pairs padded to 16, multiplied 16 × 16 pairs
//! at a time by `tdpbf16ps` ([`tiles`]), or by its emulation in the tests of every machine.
//!
//! Matrix multiply-adds (Arm's `bfmmla`, [`Isa::Bf16`]): the same A, B's panels with each
//! quad of k interleaved by column pair, multiplied 2 × 2 at a time ([`mmla`]), or by the
//! portable twin of those loops in the tests of every machine.
//!
//! Portable fallback (every other level): the same maths (bf16-rounded
//! inputs, f32 accumulation) through the `gemm` crate's f32 kernels on rounded copies; the
//! packed types then hold plain rounded f32, so such a machine pays the weight conversion once,
//! like the fast path. A packed operand keeps the route it was packed for, and the GEMM follows
//! it, so the layout and the kernel cannot disagree.

use std::ops::Range;

use rayon::prelude::*;

use super::gemm::{Gemm, Strided};
use crate::simd::isa::{self, Isa};
use crate::simd::{Lines, Mat, MatMut, MatRef};

/// Microkernel rows (broadcast operand). 12 rows × 2 zmm = 24 accumulators, + 2 B vectors +
/// a broadcast register = 27 of the 32 zmm: no spills, and 24 independent `vdpbf16ps` chains
/// cover its latency × throughput (2 per cycle here; 8 chains reach only ~60 % of peak).
pub const MR: usize = 12;
/// Microkernel columns (vector operand): two zmm of 16 f32 lanes.
pub const NR: usize = 32;
/// K block, in elements (even); K is split into equal blocks of at most this. Measured (1
/// core, ViT shapes): 256 → ~310, 1024 → ~440, 4096 → ~480 GFLOP/s. Each k block costs a
/// read-modify-write pass over the C tile, and C (1800 × 4096 f32 = 29 MB) lives in L3/DRAM,
/// while the operands stream well from L2: so no K blocking up to K = 4096. The B micro-panel
/// (≤ 4096 × 32 bf16 = 256 KiB) and the A block (MC × KC bf16 ≤ 384 KiB) share the 1 MiB L2.
const KC: usize = 4096;
/// Bytes of A per row block (MC × KC bf16), so it stays in L2 beside the B micro-panel. The
/// rows are split into equal blocks (in whole MR panels) under this: M = 64, K = 576 is one
/// block of 64 rows, not 48 + 16 (a 16-row block is two latency-bound 8-row tiles).
const A_BLOCK_BYTES: usize = 384 * 1024;
/// Columns of B packed per block when B (im2col) is converted per call: small, so the freshly
/// packed block is still in L2 when the kernels read it.
const NC: usize = 128;

/// The route of the bf16 products at `level`: AMX tiles, the AVX512-BF16 fast path, Arm's
/// `bfmmla`, or the portable fallback (no AVX2, AVX-512F or plain NEON route: those levels
/// take the fallback).
pub fn route(level: Isa) -> Isa {
    match level {
        Isa::Amx => Isa::Amx,
        Isa::Avx512Bf16 => Isa::Avx512Bf16,
        Isa::Bf16 => Isa::Bf16,
        Isa::Avx512 | Isa::Avx2 | Isa::Portable | Isa::Neon | Isa::Dotprod | Isa::I8mm => Isa::Portable,
    }
}

/// Whether bf16 products run natively on this thread's route ([`isa::current`]).
pub fn native() -> bool {
    route(isa::current()) != Isa::Portable
}

/// Whether they also run faster than f32's: what `--precision auto` picks bf16 for. Not on Arm
/// (`bfmmla`), whose speed no Arm CPU has measured yet. Not on
/// Intel's cores: on an Intel Xeon with AVX512-BF16 this GEMM ran at 0.51-0.76x the `gemm`
/// crate's f32 on every shape of `examples/bf16_bench.rs` (85 against 137 GFLOP/s on one
/// thread), and a ViT-S image took 4.71 s in bf16 against 2.69 s in f32 (PERFORMANCE.md, step
/// 23), where AMD's Zen 5 runs it at 3.6-3.9x f32. Taken for every Intel CPU until one is
/// measured otherwise; `--precision bf16` still asks for it.
pub fn pays() -> bool {
    let r = route(isa::current());
    r == Isa::Amx || (r == Isa::Avx512Bf16 && !isa::intel())
}

/// f32 → bf16 bits, round-to-nearest-even, denormals flushed to signed zero and NaN kept quiet:
/// bit-for-bit what `vcvtne2ps2bf16` does (it ignores MXCSR and treats denormal inputs as 0).
/// Written as selects, not branches, so that the loops calling it vectorise where the CPU has no
/// conversion instruction (the scalar packers: Arm, the emulations).
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let zero = (b >> 16) & 0x8000;
    let quiet = (b >> 16) | 0x40;
    let finite = if b & 0x7f80_0000 == 0 { zero } else { rounded };
    (if x.is_nan() { quiet } else { finite }) as u16
}

/// `x` rounded to the nearest bf16 value (as the fast path sees it), as f32.
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    f32::from_bits((f32_to_bf16(x) as u32) << 16)
}

#[inline]
pub(crate) fn pair(lo: f32, hi: f32) -> u32 {
    f32_to_bf16(lo) as u32 | (f32_to_bf16(hi) as u32) << 16
}

// ---------------------------------------------------------------------------------------------
// Packing. B panels (width w = NR) come from two shapes of source:
// * "rows": the panel's w lines are rows of a row-major matrix whose k runs along the row
//   (a Linear weight as out × in). Pairs are adjacent in memory already.
// * "cols": the panel's w lines are columns of a row-major K × lines matrix (im2col, or B
//   given K×N). Pairs come from two consecutive rows and must be interleaved.
// dst layout for a block of k pairs [kp0, kp0 + kps): panel p at p·kps·w, then kp·w + line.
// Lines past the end and k past `k` are zero, so the kernel needs no K tail and computes
// whole 32-column tiles (masked only at the C store).
// ---------------------------------------------------------------------------------------------

// The packers take the route of the operand they fill (`Isa::Avx512Bf16` only where the CPU has
// it: see `PackedB::build`), and fall to the scalar twin on any other. Each reads the block of
// its source that one call packs, a view whose columns (for `pack_cols` its rows) are the k
// values [k0, min(k0 + 2·kps, k)) and whose rows (columns) are the lines.

/// The k values of a packing block from k0: 2·kps of them, or the rest of k.
fn k_block(k: usize, k0: usize, kps: usize) -> usize {
    (2 * kps).min(k - k0)
}

/// Pack the lines of `src` (its rows, each its k values) into panels of w lines, `kps` k pairs.
fn pack_rows(isa: Isa, src: Mat<&[f32]>, kps: usize, w: usize, dst: &mut [u32]) {
    let panels = src.rows().div_ceil(w);
    let dst = &mut dst[..panels * kps * w];
    match isa {
        // SAFETY: the route is AVX512-BF16 only on a CPU that has it.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Bf16 if w == NR => unsafe { avx512bf16::pack_rows_nr(src, kps, dst) },
        _ => pack_rows_scalar(src, kps, w, dst),
    }
}

fn pack_rows_scalar(src: Mat<&[f32]>, kps: usize, w: usize, dst: &mut [u32]) {
    let (lines, k1) = (src.rows(), src.cols());
    let panels = lines.div_ceil(w);
    for p in 0..panels {
        let panel = &mut dst[p * kps * w..(p + 1) * kps * w];
        for i in 0..w {
            let l = p * w + i;
            for kp in 0..kps {
                let (ka, kb) = (2 * kp, 2 * kp + 1);
                panel[kp * w + i] = if l < lines && ka < k1 {
                    let row = src.row(l);
                    pair(row[ka], if kb < k1 { row[kb] } else { 0.0 })
                } else {
                    0
                };
            }
        }
    }
}

/// A-operand layout: the rows of `src` as bf16 pairs, row-major with `kps` words per row:
/// dst[r·kps + kp] for its k values, zero past them. The microkernel broadcasts from R row
/// streams directly, so A needs no transposition: this is a straight vector conversion (A is
/// converted on every call).
pub(crate) fn convert_rows(isa: Isa, src: Mat<&[f32]>, kps: usize, dst: &mut [u32]) {
    convert_rows_at(isa, src, kps, kps, dst)
}

/// [`convert_rows`] into words not yet initialised (m rows of `kps`, every one written).
pub(crate) fn convert_rows_uninit(isa: Isa, src: Mat<&[f32]>, kps: usize, dst: &mut [std::mem::MaybeUninit<u32>]) {
    assert!(dst.len() >= src.rows() * kps, "convert_rows: {} words for {} rows of {kps} pairs", dst.len(), src.rows());
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Bf16 {
        // SAFETY: the route is AVX512-BF16 only on a CPU that has it.
        unsafe { avx512bf16::convert_rows_uninit(src, kps, kps, dst) };
        return;
    }
    let _ = isa;
    for (r, out) in dst.chunks_exact_mut(kps).take(src.rows()).enumerate() {
        let row = src.row(r);
        for (i, d) in out.iter_mut().enumerate() {
            let at = |j: usize| row.get(j).copied().unwrap_or(0.0);
            d.write(pair(at(2 * i), at(2 * i + 1)));
        }
    }
}

/// [`convert_rows`] with the rows `ld` ≥ kps words apart (what lies between is left as it is).
fn convert_rows_at(isa: Isa, src: Mat<&[f32]>, kps: usize, ld: usize, dst: &mut [u32]) {
    assert!(ld >= kps, "convert_rows: rows {ld} words apart for {kps} pairs");
    if src.rows() == 0 {
        return;
    }
    let dst = &mut dst[..(src.rows() - 1) * ld + kps];
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Bf16 {
        // SAFETY: the route is AVX512-BF16 only on a CPU that has it.
        unsafe { avx512bf16::convert_rows(src, kps, ld, dst) };
        return;
    }
    let _ = isa;
    for r in 0..src.rows() {
        let (row, out) = (src.row(r), &mut dst[r * ld..r * ld + kps]);
        // The whole pairs in one straight loop (vectorised), then a half pair and zeros.
        let whole = row.chunks_exact(2);
        let (half, n) = (whole.remainder(), whole.len());
        for (d, p) in out.iter_mut().zip(whole) {
            *d = pair(p[0], p[1]);
        }
        for (i, d) in out.iter_mut().enumerate().skip(n) {
            *d = if i == n { half.first().map_or(0, |&x| pair(x, 0.0)) } else { 0 };
        }
    }
}

/// The words between consecutive rows of A in the tiles' buffer for `kps` pairs: an odd number
/// of cache lines. At a power of two (ViT-L's K = 1024 and 4096: 2 and 8 KiB) the 32 rows that
/// a group's two A tiles read fell in one or two of L1's 64 sets (12 ways each), and every
/// tile load missed.
fn tile_a_stride(kps: usize) -> usize {
    let lines = kps.div_ceil(16);
    (lines | 1) * 16
}

/// Where the rows of an A given as bf16 pairs lie ([`Pairs`]): `kps` words of pairs per row
/// (zeros past its k values), rows `stride` words apart, `rows` of them stored (zeros past m).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PairsLayout {
    pub kps: usize,
    pub stride: usize,
    pub rows: usize,
}

impl PairsLayout {
    /// The tiles' layout for m rows of k: whole tiles of rows, each an odd number of cache
    /// lines long, as the product's own conversion lays A out ([`tile_a_stride`]).
    fn tiles(kernel: Kernel, k: usize, m: usize) -> Self {
        let kps = kernel.pairs(k);
        PairsLayout { kps, stride: tile_a_stride(kps), rows: kernel.rows(m) }
    }
}

/// A product's A, m rows of bf16 pairs laid out for the tiles, made by the op before it (a
/// LayerNorm, `layer_norm::LayerNormOp::run_pairs`, or fc1, [`linear_bf16_pairs`]) in place
/// of its f32 output.
pub(crate) struct Pairs {
    pub words: Lines<u32>,
    pub m: usize,
    pub layout: PairsLayout,
}

impl Pairs {
    /// A as the products read it, checked against B's layout for m rows.
    fn operand(&self, b: &PackedB) -> Operand<'_> {
        let want = b.tile_pairs(self.m).map(|(l, _)| l);
        assert!(want == Some(self.layout) && self.words.len() >= self.layout.rows * self.layout.stride, "bf16 pairs: {:?} for {want:?}", self.layout);
        Operand::Rows(&self.words, self.layout.stride)
    }
}

/// Pack the lines of `src` (its columns, each its k values down the rows) into panels of w
/// lines, `kps` k pairs.
fn pack_cols(isa: Isa, src: Mat<&[f32]>, kps: usize, w: usize, dst: &mut [u32]) {
    let (k1, lines) = (src.rows(), src.cols());
    let panels = lines.div_ceil(w);
    let dst = &mut dst[..panels * kps * w];
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Bf16 && w == NR {
        // SAFETY: the route is AVX512-BF16 only on a CPU that has it.
        unsafe { avx512bf16::pack_cols_nr(src, kps, dst) };
        return;
    }
    let _ = isa;
    for p in 0..panels {
        let panel = &mut dst[p * kps * w..(p + 1) * kps * w];
        for kp in 0..kps {
            let (ka, kb) = (2 * kp, 2 * kp + 1);
            for i in 0..w {
                let l = p * w + i;
                panel[kp * w + i] = if l < lines && ka < k1 { pair(src.row(ka)[l], if kb < k1 { src.row(kb)[l] } else { 0.0 }) } else { 0 };
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Pre-packed operands.
// ---------------------------------------------------------------------------------------------

/// The code that multiplies packed operands: what a [`Store::Panels`] was laid out for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// The 12 × 32 `vdpbf16ps` register tile (`avx512bf16.rs`).
    Avx512Bf16,
    /// AMX tiles (`tiles.rs`): the hardware's, or (`emulated`) the portable twin's.
    Tiles { emulated: bool },
    /// 2 × 2 matrix multiply-adds (`mmla.rs`): `bfmmla` (`neon.rs`), or (`emulated`) the
    /// portable twin's.
    Mmla { emulated: bool },
}

impl Kernel {
    /// The kernel of route `isa` (a [`route`], lowered to what the CPU has), if it packs.
    pub(crate) fn of(isa: Isa) -> Option<Kernel> {
        match isa {
            Isa::Amx => Some(Kernel::Tiles { emulated: false }),
            Isa::Avx512Bf16 => Some(Kernel::Avx512Bf16),
            Isa::Bf16 => Some(Kernel::Mmla { emulated: false }),
            _ => None,
        }
    }

    /// The k pairs stored for k values: in whole units of [`Kernel::pair_unit`].
    fn pairs(self, k: usize) -> usize {
        k.div_ceil(2 * self.pair_unit()) * self.pair_unit()
    }

    /// The k pairs a kernel takes at a time: a tile's 16 rows, a quad's two, or one.
    fn pair_unit(self) -> usize {
        match self {
            Kernel::Avx512Bf16 => 1,
            Kernel::Tiles { .. } => crate::simd::tiles::ROWS,
            Kernel::Mmla { .. } => 2,
        }
    }

    /// The rows of A stored (and readable) for m rows: whole tiles' 16 on the tile route.
    fn rows(self, m: usize) -> usize {
        match self {
            Kernel::Avx512Bf16 | Kernel::Mmla { .. } => m,
            Kernel::Tiles { .. } => m.next_multiple_of(crate::simd::tiles::ROWS),
        }
    }

    /// Rows of C per microkernel call: the unit the rows are split in.
    fn mr(self) -> usize {
        match self {
            Kernel::Avx512Bf16 => MR,
            Kernel::Tiles { .. } => tiles::TM,
            Kernel::Mmla { .. } => mmla::MR,
        }
    }

    /// The route of the vector packers: AVX512-BF16 wherever the CPU has it (every AMX CPU),
    /// else the scalar ones.
    fn packer(self) -> Isa {
        match self {
            Kernel::Avx512Bf16 | Kernel::Tiles { emulated: false } => Isa::Avx512Bf16,
            Kernel::Tiles { emulated: true } | Kernel::Mmla { .. } => Isa::Portable,
        }
    }

    /// B's panels (`kps` pairs of NR words each) as this kernel reads them: the pair layout
    /// the packers write, or its quads interleaved by column pair for the multiply-adds.
    fn finish_panels(self, panels: &mut [u32], kps: usize) {
        if let Kernel::Mmla { .. } = self {
            for panel in panels.chunks_exact_mut(kps * NR) {
                mmla::interleave(panel, kps);
            }
        }
    }
}

#[derive(Clone, Debug)]
enum Store {
    /// Pair-interleaved panels over the whole K (`kernel.pairs(k)` pairs per panel), for
    /// `kernel`, built only where the CPU has it (or for the emulation).
    Panels { words: Lines<u32>, kernel: Kernel },
    /// Portable fallback: bf16-rounded f32, row-major (K×N for B, M×K for A).
    Rounded(Vec<f32>),
}

impl Store {
    /// The route this layout is read by.
    fn isa(&self) -> Isa {
        match self {
            Store::Panels { kernel: Kernel::Avx512Bf16, .. } => Isa::Avx512Bf16,
            Store::Panels { kernel: Kernel::Tiles { .. }, .. } => Isa::Amx,
            Store::Panels { kernel: Kernel::Mmla { .. }, .. } => Isa::Bf16,
            Store::Rounded(_) => Isa::Portable,
        }
    }
}

/// Right operand B (K×N), converted to bf16 and packed once (Linear weights).
#[derive(Clone, Debug)]
pub struct PackedB {
    k: usize,
    n: usize,
    store: Store,
}

impl PackedB {
    /// Where B is in panels, the rows of A that [`gemm_bf16_pairs`] takes: k pairs per row, and
    /// the rows stored for m rows (whole tiles' on the tile route).
    pub(crate) fn pair_rows(&self, m: usize) -> Option<(usize, usize)> {
        match &self.store {
            Store::Panels { kernel, .. } => Some((kernel.pairs(self.k), kernel.rows(m))),
            Store::Rounded(_) => None,
        }
    }

    /// On the tile route, the layout of an A of m rows that the products from [`Pairs`] take,
    /// and the level whose conversion rounds an f32 A as the products' own would
    /// (`convert_rows`); `None` elsewhere.
    pub(crate) fn tile_pairs(&self, m: usize) -> Option<(PairsLayout, Isa)> {
        match &self.store {
            Store::Panels { kernel: kernel @ Kernel::Tiles { .. }, .. } => Some((PairsLayout::tiles(*kernel, self.k, m), kernel.packer())),
            _ => None,
        }
    }

    /// Whether [`linear_bf16_pairs`] (and `_from_pairs`) takes this B for m rows: on the tiles
    /// with one k block, n a multiple of 32.
    pub(crate) fn gives_pairs(&self, m: usize) -> bool {
        match &self.store {
            Store::Panels { kernel: kernel @ Kernel::Tiles { .. }, .. } => {
                m > 0 && self.k > 0 && kernel.pairs(self.n) * 2 == self.n && kernel.pairs(self.k) <= tiles::KC / 2
            }
            _ => false,
        }
    }

    /// From B given K×N row-major, for the route of [`isa::current`].
    pub fn from_f32_kn(data: &[f32], k: usize, n: usize) -> Self {
        Self::build(data, k, n, false, isa::current())
    }

    /// From Bᵀ given N×K row-major: a PyTorch Linear weight (out = N, in = K), for the route of
    /// [`isa::current`].
    pub fn from_f32_nk(data: &[f32], n: usize, k: usize) -> Self {
        Self::build(data, k, n, true, isa::current())
    }

    /// Packed for the route of `level` (lowered to what the CPU has).
    pub(crate) fn build(data: &[f32], k: usize, n: usize, transposed: bool, level: Isa) -> Self {
        Self::build_for(data, k, n, transposed, Kernel::of(route(isa::usable(level))))
    }

    /// From a view: Bᵀ (N×K) where `transposed`, else B (K×N), rows any stride apart (one
    /// head's k or v inside attention's qkv rows), for the route of `level`.
    pub(crate) fn build_view(src: Mat<&[f32]>, transposed: bool, level: Isa) -> Self {
        let (k, n) = if transposed { (src.cols(), src.rows()) } else { (src.rows(), src.cols()) };
        Self::pack(src, k, n, transposed, Kernel::of(route(isa::usable(level))))
    }

    /// Packed for `kernel`, or rounded for the portable fallback (`None`).
    pub(crate) fn build_for(data: &[f32], k: usize, n: usize, transposed: bool, kernel: Option<Kernel>) -> Self {
        assert!(data.len() >= k * n, "PackedB: {} values for {k}×{n}", data.len());
        let src = if transposed { Mat::from_slice(data, n, k, k) } else { Mat::from_slice(data, k, n, n) };
        Self::pack(src, k, n, transposed, kernel)
    }

    fn pack(src: Mat<&[f32]>, k: usize, n: usize, transposed: bool, kernel: Option<Kernel>) -> Self {
        let store = if let Some(kernel) = kernel {
            let kps = kernel.pairs(k);
            let panels = n.div_ceil(NR);
            let mut p = Lines::<u32>::zeros(panels * kps * NR);
            let isa = kernel.packer();
            // Pack panel by panel in parallel (one-time cost, but ViT-L has 96 such matrices).
            p.par_chunks_mut((kps * NR).max(1)).enumerate().for_each(|(pi, dst)| {
                let (l0, l1) = (pi * NR, ((pi + 1) * NR).min(n));
                if transposed {
                    pack_rows(isa, src.block(l0, 0, l1 - l0, k), kps, NR, dst);
                } else {
                    pack_cols(isa, src.block(0, l0, k, l1 - l0), kps, NR, dst);
                }
                kernel.finish_panels(dst, kps);
            });
            Store::Panels { words: p, kernel }
        } else {
            let mut r = vec![0f32; k * n];
            for kk in 0..k {
                for j in 0..n {
                    r[kk * n + j] = round_bf16(if transposed { src.row(j)[kk] } else { src.row(kk)[j] });
                }
            }
            Store::Rounded(r)
        };
        PackedB { k, n, store }
    }

    pub fn k(&self) -> usize {
        self.k
    }
    pub fn n(&self) -> usize {
        self.n
    }
    /// The route the products with this operand take.
    pub fn isa(&self) -> Isa {
        self.store.isa()
    }
}

/// Left operand A (M×K), converted to bf16 and packed once (convolution weights, cout × cin·9).
#[derive(Clone, Debug)]
pub struct PackedA {
    m: usize,
    k: usize,
    store: Store,
}

impl PackedA {
    /// From A given M×K row-major (PyTorch conv weight (cout, cin, kh, kw) flattened), for the
    /// route of [`isa::current`].
    pub fn from_f32(data: &[f32], m: usize, k: usize) -> Self {
        Self::build(data, m, k, isa::current())
    }

    /// Packed for the route of `level` (lowered to what the CPU has).
    pub(crate) fn build(data: &[f32], m: usize, k: usize, level: Isa) -> Self {
        Self::build_for(data, m, k, Kernel::of(route(isa::usable(level))))
    }

    /// Packed for `kernel`, or rounded for the portable fallback (`None`).
    pub(crate) fn build_for(data: &[f32], m: usize, k: usize, kernel: Option<Kernel>) -> Self {
        assert!(data.len() >= m * k, "PackedA: {} values for {m}×{k}", data.len());
        let store = match kernel {
            None => Store::Rounded(data[..m * k].iter().map(|&x| round_bf16(x)).collect()),
            Some(kernel) => {
                let kps = kernel.pairs(k);
                // Rows past m (the tiles' padding) stay zero.
                let mut p = Lines::<u32>::zeros(kernel.rows(m) * kps);
                convert_rows(kernel.packer(), Mat::from_slice(data, m, k, k), kps, &mut p);
                Store::Panels { words: p, kernel }
            }
        };
        PackedA { m, k, store }
    }

    pub fn m(&self) -> usize {
        self.m
    }
    pub fn k(&self) -> usize {
        self.k
    }
    /// The route the products with this operand take.
    pub fn isa(&self) -> Isa {
        self.store.isa()
    }
}

// ---------------------------------------------------------------------------------------------
// Public GEMMs.
// ---------------------------------------------------------------------------------------------

/// `C (m×n) = [C +] A · B`: A (m×k) is f32, converted to bf16 while packed; B is pre-packed
/// (k×n); C is f32. `threads` ≥ 1 splits the work on the rayon pool (1 = run on the caller's
/// thread, e.g. inside its own tiles). Panics where the shapes disagree.
pub fn gemm_bf16(a: Mat<&[f32]>, b: &PackedB, mut c: Mat<&mut [f32]>, accumulate: bool, threads: usize) {
    let (m, k, n) = (a.rows(), a.cols(), b.n);
    assert_eq!(k, b.k, "gemm_bf16: A has k={k}, B has k={}", b.k);
    assert!(c.rows() == m && c.cols() == n, "gemm_bf16: C is {}×{} for {m}×{n}", c.rows(), c.cols());
    if m == 0 || n == 0 {
        return;
    }
    match &b.store {
        Store::Rounded(bb) => {
            let ar: Vec<f32> = (0..m).flat_map(|i| a.row(i).iter().map(|&x| round_bf16(x))).collect();
            portable_gemm(Mat::from_slice(&ar, m, k, k), Mat::from_slice(bb, k, n, n), c, accumulate, threads);
        }
        Store::Panels { words, kernel } => {
            let job = Job { k, kernel: *kernel, a: Operand::F32(a), b: Operand::Packed(words), c: c.as_raw_mut(), accumulate, epilogue: None };
            // Split M so each thread converts only its own rows of A; B is shared (L3).
            job.run(threads, m >= n.min(2 * NR * threads) || n < 2 * NR);
        }
    }
}

/// `C (m×n) = [C +] A · B` on this thread, A already bf16 pairs: its m rows of
/// [`PackedB::pair_rows`]'s k pairs each, readable (zeros) to its rows rounded up to that
/// kernel's, on a cache line where the kernel is the tiles'. Panics where B is not in panels or
/// the shapes disagree.
pub(crate) fn gemm_bf16_pairs(a: &[u32], b: &PackedB, mut c: Mat<&mut [f32]>, accumulate: bool) {
    let (m, n) = (c.rows(), b.n);
    let Store::Panels { words, kernel } = &b.store else { panic!("gemm_bf16_pairs: B is not in panels") };
    let kps = kernel.pairs(b.k);
    assert!(c.cols() == n && a.len() >= kernel.rows(m) * kps, "gemm_bf16_pairs: {} words of A for {m} rows of {kps} pairs", a.len());
    if m == 0 || n == 0 {
        return;
    }
    let job = Job { k: b.k, kernel: *kernel, a: Operand::Packed(a), b: Operand::Packed(words), c: c.as_raw_mut(), accumulate, epilogue: None };
    job.run(1, true);
}

/// `C (m×n) = bias + A · B`, then GELU where `gelu` names the level of its vector code: a
/// linear layer's product and epilogue. On the tiles the epilogue is applied to each group of
/// C as it leaves them (no pass over C to fill it with the bias, none to read it back, none for
/// the GELU); elsewhere it is [`gemm_bf16`] on C filled with the bias, then the GELU. Panics
/// where the shapes disagree.
pub fn gemm_bf16_bias(a: Mat<&[f32]>, b: &PackedB, mut c: Mat<&mut [f32]>, bias: &[f32], gelu: Option<Isa>, threads: usize) {
    let (m, k, n) = (a.rows(), a.cols(), b.n);
    assert!(bias.len() >= n, "gemm_bf16_bias: {} biases for {n} columns", bias.len());
    match &b.store {
        Store::Panels { words, kernel: kernel @ Kernel::Tiles { .. } } if m > 0 && n > 0 && k > 0 => {
            assert!(c.rows() == m && c.cols() == n, "gemm_bf16_bias: C is {}×{} for {m}×{n}", c.rows(), c.cols());
            tiles_with_epilogue(a, b, words, *kernel, c.as_raw_mut(), bias, gelu, threads);
        }
        _ => {
            par_rows(c.rb_mut(), |r| r.copy_from_slice(&bias[..n]));
            gemm_bf16(a, b, c.rb_mut(), true, threads);
            if let Some(level) = gelu {
                par_rows(c, |r| crate::simd::math::gelu_in_place(level, r));
            }
        }
    }
}

/// [`gemm_bf16_bias`] into a new m × n matrix: on the tiles, which write every element of C
/// with the epilogue, a buffer that is never zeroed (zeroing ViT-L's linear outputs, 65 MB a
/// block, ran on the calling thread alone).
pub fn linear_bf16(a: Mat<&[f32]>, b: &PackedB, bias: &[f32], gelu: Option<Isa>, threads: usize) -> Vec<f32> {
    let (m, k, n) = (a.rows(), a.cols(), b.n);
    match &b.store {
        Store::Panels { words, kernel: kernel @ Kernel::Tiles { .. } } if m > 0 && n > 0 && k > 0 => {
            let mut y: Vec<f32> = Vec::with_capacity(m * n);
            tiles_with_epilogue(a, b, words, *kernel, MatMut::from_mut_ptr(y.as_mut_ptr(), m, n, n), bias, gelu, threads);
            // SAFETY: with an epilogue the tiles write every group of C through its edge buffer
            // (`tiles::block`), with `accumulate` false reading none first: all m · n floats.
            unsafe { y.set_len(m * n) };
            y
        }
        _ => {
            let mut y = vec![0f32; m * n];
            gemm_bf16_bias(a, b, Mat::from_slice_mut(&mut y, m, n, n), bias, gelu, threads);
            y
        }
    }
}

/// The tile route of [`gemm_bf16_bias`] and [`linear_bf16`]: C (m × n, writable, not read) =
/// bias + A · B [then GELU], the epilogue applied as each group leaves the tiles. Panics where
/// A's k is not B's or the biases are fewer than its columns.
#[allow(clippy::too_many_arguments)]
fn tiles_with_epilogue(a: Mat<&[f32]>, b: &PackedB, words: &Lines<u32>, kernel: Kernel, c: MatMut<f32>, bias: &[f32], gelu: Option<Isa>, threads: usize) {
    assert!(a.cols() == b.k, "gemm_bf16_bias: A has k={}, B has k={}", a.cols(), b.k);
    tiles_bias(Operand::F32(a), b, words, kernel, c, bias, gelu, threads);
}

/// [`tiles_with_epilogue`] for A as f32 rows or as pairs (k = B's).
#[allow(clippy::too_many_arguments)]
fn tiles_bias(a: Operand, b: &PackedB, words: &Lines<u32>, kernel: Kernel, c: MatMut<f32>, bias: &[f32], gelu: Option<Isa>, threads: usize) {
    let (m, n) = (c.rows(), b.n);
    assert!(bias.len() >= n, "gemm_bf16_bias: {} biases for {n} columns", bias.len());
    let job = Job {
        k: b.k,
        kernel,
        a,
        b: Operand::Packed(words),
        c,
        accumulate: false,
        epilogue: Some(Epilogue { bias: &bias[..n], gelu, residual: None, bf16: None }),
    };
    job.run(threads, m >= n.min(2 * NR * threads) || n < 2 * NR);
}

/// [`linear_bf16`] with A given as [`Pairs`] (a LayerNorm's output written straight in bf16,
/// `layer_norm::LayerNormOp::run_pairs`). `None` where B is not on the tiles. Panics where A is
/// not laid out for B.
pub(crate) fn linear_bf16_from_pairs(a: &Pairs, b: &PackedB, bias: &[f32], gelu: Option<Isa>, threads: usize) -> Option<Vec<f32>> {
    let (m, k, n) = (a.m, b.k, b.n);
    let Store::Panels { words, kernel: kernel @ Kernel::Tiles { .. } } = &b.store else { return None };
    if m == 0 || n == 0 || k == 0 {
        return None;
    }
    let mut y: Vec<f32> = Vec::with_capacity(m * n);
    tiles_bias(a.operand(b), b, words, *kernel, MatMut::from_mut_ptr(y.as_mut_ptr(), m, n, n), bias, gelu, threads);
    // SAFETY: with an epilogue the tiles write every group of C through its edge buffer
    // (`tiles::block`), with `accumulate` false reading none first: all m · n floats.
    unsafe { y.set_len(m * n) };
    Some(y)
}

/// `f` on each row of `c`, the rows split on the rayon pool.
fn par_rows(mut c: Mat<&mut [f32]>, f: impl Fn(&mut [f32]) + Sync) {
    let (rows, cols, raw) = (c.rows(), c.cols(), c.as_raw_mut());
    let ptr = crate::simd::SendPtr(raw.ptr());
    let stride = raw.stride();
    (0..rows).into_par_iter().for_each(|i| {
        // SAFETY: row i of `c` (cols floats at i · stride), borrowed mutably for this call, and
        // each task's row its own (`Mat` rows are disjoint).
        f(unsafe { std::slice::from_raw_parts_mut(ptr.get().add(i * stride), cols) })
    });
}

/// [`linear_bf16`] with its output rounded to bf16 as the next product's A: `bias + a · b`
/// [then GELU] as pairs of columns, rows of [`PackedB::pair_rows`]'s words for a B of k = n
/// (n/2 words), zeros past its m rows to whole tiles'. On the tiles with a single k block
/// (k ≤ `tiles::KC`) and n a multiple of 32, where the epilogue stores bf16 in place of C: a
/// ViT's fc1, whose f32 output (29 MB at ViT-L's 1800 tokens) was written to be read back by
/// fc2 and rounded to these same bits there. `None` elsewhere.
pub(crate) fn linear_bf16_pairs(a: Mat<&[f32]>, b: &PackedB, bias: &[f32], gelu: Option<Isa>, threads: usize) -> Option<Pairs> {
    assert!(a.cols() == b.k, "linear_bf16_pairs: A has k={}, B has k={}", a.cols(), b.k);
    pairs_out(Operand::F32(a), a.rows(), b, bias, gelu, threads)
}

/// [`linear_bf16_pairs`] with A given as [`Pairs`]. Panics where A is not laid out for B.
pub(crate) fn linear_bf16_pairs_from_pairs(a: &Pairs, b: &PackedB, bias: &[f32], gelu: Option<Isa>, threads: usize) -> Option<Pairs> {
    pairs_out(a.operand(b), a.m, b, bias, gelu, threads)
}

/// [`linear_bf16_pairs`] for A as f32 rows or pairs (m rows of B's k).
fn pairs_out(a: Operand, m: usize, b: &PackedB, bias: &[f32], gelu: Option<Isa>, threads: usize) -> Option<Pairs> {
    let (k, n) = (b.k, b.n);
    let Store::Panels { words, kernel: kernel @ Kernel::Tiles { .. } } = &b.store else { return None };
    if !b.gives_pairs(m) {
        return None;
    }
    assert!(bias.len() >= n, "linear_bf16_pairs: {} biases for {n} columns", bias.len());
    // The next product's A: rows of n/2 words, an odd number of lines apart.
    let layout = PairsLayout::tiles(*kernel, n, m);
    let (rows, stride) = (layout.rows, layout.stride);
    let mut out = Lines::<u32>::zeros(0);
    // SAFETY: the job's epilogue writes every element of the m × n bf16 matrix (each group goes
    // through an edge buffer and is stored to `bf16`, `tiles::block`); the words past n/2 in
    // each row and the rows past m are zeroed below: all `rows · stride` words. C (a view of
    // the same words as f32 rows, inside them) is neither read (no accumulate, one k block) nor
    // written (the `bf16` store).
    unsafe {
        out.fill_uninit(rows * stride, |p| {
            let job = Job {
                k,
                kernel: *kernel,
                a,
                b: Operand::Packed(words),
                c: MatMut::from_mut_ptr(p as *mut f32, m, n, stride),
                accumulate: false,
                epilogue: Some(Epilogue { bias: &bias[..n], gelu, residual: None, bf16: Some(MatMut::from_mut_ptr(p as *mut u16, m, n, 2 * stride)) }),
            };
            for r in 0..m {
                std::ptr::write_bytes(p.add(r * stride + n / 2), 0, stride - n / 2);
            }
            job.run(threads, m >= n.min(2 * NR * threads) || n < 2 * NR);
            std::ptr::write_bytes(p.add(m * stride), 0, (rows - m) * stride);
        });
    }
    Some(Pairs { words: out, m, layout })
}

/// [`linear_bf16_residual`] with A given as [`Pairs`] ([`linear_bf16_pairs`]'s output).
/// Panics where the shapes disagree, B is not on the tiles or A is not laid out for it.
pub(crate) fn linear_bf16_residual_pairs(a: &Pairs, b: &PackedB, bias: &[f32], gamma: &[f32], residual: Mat<&[f32]>, threads: usize) -> Vec<f32> {
    let (m, n) = (a.m, b.n);
    let Store::Panels { words, kernel: kernel @ Kernel::Tiles { .. } } = &b.store else { panic!("linear_bf16_residual_pairs: B is not on the tiles") };
    assert!(
        gamma.len() >= n && bias.len() >= n && residual.rows() == m && residual.cols() == n && m > 0 && n > 0,
        "linear_bf16_residual_pairs: {} gammas, {} biases, a {}×{} residual for {m}×{n}",
        gamma.len(),
        bias.len(),
        residual.rows(),
        residual.cols()
    );
    tiles_residual(a.operand(b), b.k, *kernel, words, m, n, bias, gamma, residual, threads)
}

/// The tile route of [`linear_bf16_residual`] and [`linear_bf16_residual_pairs`]: a new m × n
/// = residual + gamma ⊙ (A · B + bias), applied by the epilogue, for A as f32 rows or pairs.
#[allow(clippy::too_many_arguments)]
fn tiles_residual(
    a: Operand,
    k: usize,
    kernel: Kernel,
    words: &[u32],
    m: usize,
    n: usize,
    bias: &[f32],
    gamma: &[f32],
    residual: Mat<&[f32]>,
    threads: usize,
) -> Vec<f32> {
    let mut y: Vec<f32> = Vec::with_capacity(m * n);
    let job = Job {
        k,
        kernel,
        a,
        b: Operand::Packed(words),
        c: MatMut::from_mut_ptr(y.as_mut_ptr(), m, n, n),
        accumulate: false,
        epilogue: Some(Epilogue { bias: &bias[..n], gelu: None, residual: Some((&gamma[..n], residual.as_raw())), bf16: None }),
    };
    job.run(threads, m >= n.min(2 * NR * threads) || n < 2 * NR);
    // SAFETY: with an epilogue the tiles write every group of C through its edge buffer
    // (`tiles::block`), with `accumulate` false reading none first: all m · n floats.
    unsafe { y.set_len(m * n) };
    y
}

/// What the tiles add to a product's last k block as it leaves them ([`gemm_bf16_bias`]).
#[derive(Clone, Copy)]
pub(super) struct Epilogue<'a> {
    /// Per column of C.
    pub bias: &'a [f32],
    /// GELU after the bias, by the vector code of this level.
    pub gelu: Option<Isa>,
    /// LayerScale and the residual after the bias: C = residual + gamma ⊙ (A · B + bias), gamma
    /// per column of C, the residual C's shape ([`linear_bf16_residual`]).
    pub residual: Option<(&'a [f32], MatRef<f32>)>,
    /// C's shape in bf16, stored to in C's place: the product is the next one's A
    /// ([`linear_bf16_pairs`]).
    pub bf16: Option<MatMut<u16>>,
}

/// Where an epilogue stores a group's rows: C's floats, or bf16 values; the first row and the
/// rows' stride in elements.
#[derive(Clone, Copy)]
pub(super) enum Out {
    F32(*mut f32, usize),
    Bf16(*mut u16, usize),
}

/// [`linear_bf16`] then LayerScale and the residual add, `residual + gamma ⊙ (a · b + bias)`,
/// in the epilogue on the tiles (a ViT block's attn.proj and fc2: the product's output is
/// never stored on its own, nor read back by a pass of its own); elsewhere in a pass after
/// the product. Panics where the shapes disagree.
pub fn linear_bf16_residual(a: Mat<&[f32]>, b: &PackedB, bias: &[f32], gamma: &[f32], residual: Mat<&[f32]>, threads: usize) -> Vec<f32> {
    let (m, k, n) = (a.rows(), a.cols(), b.n);
    assert!(
        gamma.len() >= n && bias.len() >= n && residual.rows() == m && residual.cols() == n,
        "linear_bf16_residual: {} gammas, {} biases, a {}×{} residual for {m}×{n}",
        gamma.len(),
        bias.len(),
        residual.rows(),
        residual.cols()
    );
    match &b.store {
        Store::Panels { words, kernel: kernel @ Kernel::Tiles { .. } } if m > 0 && n > 0 && k > 0 => {
            tiles_residual(Operand::F32(a), k, *kernel, words, m, n, bias, gamma, residual, threads)
        }
        _ => {
            let mut y = linear_bf16(a, b, bias, None, threads);
            if n > 0 {
                y.par_chunks_mut(n).enumerate().for_each(|(i, r)| {
                    r.iter_mut().zip(residual.row(i)).zip(gamma).for_each(|((v, &x), &g)| *v = x + *v * g);
                });
            }
            y
        }
    }
}

/// `C (m×n) = [C +] A · B`: A is pre-packed (m×k), B (k×n) is f32, converted to bf16 while
/// packed; C is f32. The convolution shape: weights × im2col columns. Panics where the shapes
/// disagree.
pub fn gemm_bf16_packed_a(a: &PackedA, b: Mat<&[f32]>, mut c: Mat<&mut [f32]>, accumulate: bool, threads: usize) {
    let (m, k, n) = (a.m, a.k, b.cols());
    assert_eq!(b.rows(), k, "gemm_bf16_packed_a: A has k={k}, B has k={}", b.rows());
    assert!(c.rows() == m && c.cols() == n, "gemm_bf16_packed_a: C is {}×{} for {m}×{n}", c.rows(), c.cols());
    if m == 0 || n == 0 {
        return;
    }
    match &a.store {
        Store::Rounded(ar) => {
            let mut br = vec![0f32; k * n];
            for (kk, dst) in br.chunks_exact_mut(n).enumerate() {
                for (d, &v) in dst.iter_mut().zip(b.row(kk)) {
                    *d = round_bf16(v);
                }
            }
            portable_gemm(Mat::from_slice(ar, m, k, k), Mat::from_slice(&br, k, n, n), c, accumulate, threads);
        }
        Store::Panels { words, kernel } => {
            let job = Job { k, kernel: *kernel, a: Operand::Packed(words), b: Operand::F32(b), c: c.as_raw_mut(), accumulate, epilogue: None };
            // Split N so each thread converts only its own columns of B.
            job.run(threads, n < 2 * NR * threads && m > n);
        }
    }
}

/// `C (m×n) = P · B` with P = e^(scale · (S − max of its row)), row by row, and `sums` (m) the
/// rows' sums of P: attention's softmax and its product with v, the normalisation left to the
/// caller (one multiply per output instead of one per probability). The exps go straight into
/// the bf16 pairs that the kernel reads, in one pass over S (not the exps in f32, a pass to
/// scale them and a pass to convert them); their sums are the f32 values' (as a softmax in f32
/// whose result is then rounded to bf16). One thread: the caller runs many of these at once.
/// Panics where the shapes disagree.
pub fn softmax_product(s: Mat<&[f32]>, scale: f32, b: &PackedB, mut c: Mat<&mut [f32]>, sums: &mut [f32]) {
    let (m, k, n) = (s.rows(), s.cols(), b.n);
    assert_eq!(k, b.k, "softmax_product: S has k={k}, B has k={}", b.k);
    assert!(c.rows() == m && c.cols() == n && sums.len() == m, "softmax_product: C is {}×{}, {} sums for {m}×{n}", c.rows(), c.cols(), sums.len());
    if m == 0 || n == 0 {
        return;
    }
    match &b.store {
        Store::Rounded(bb) => {
            let mut p = vec![0f32; m * k];
            for (r, (pr, sum)) in p.chunks_exact_mut(k.max(1)).zip(sums.iter_mut()).enumerate() {
                let mut words = vec![0u32; k.div_ceil(2)];
                *sum = exp_pairs(Isa::Portable, s.row(r), scale, &mut words);
                for (j, v) in pr.iter_mut().enumerate() {
                    *v = f32::from_bits((words[j / 2] >> (16 * (j % 2))) << 16);
                }
            }
            portable_gemm(Mat::from_slice(&p, m, k, k), Mat::from_slice(bb, k, n, n), c, false, 1);
        }
        Store::Panels { words, kernel } => {
            let kps = kernel.pairs(k);
            crate::simd::with_local(&PAIRS, |buf| {
                let len = kernel.rows(m) * kps;
                if buf.len() < len {
                    *buf = Lines::zeros(len);
                }
                let (rows, pad) = buf[..len].split_at_mut(m * kps);
                for ((r, dst), sum) in rows.chunks_exact_mut(kps).enumerate().zip(sums.iter_mut()) {
                    *sum = exp_pairs(kernel.packer(), s.row(r), scale, dst);
                }
                // The tiles read A's rows to the next 16: zeros, not an earlier call's values.
                pad.fill(0);
                let job = Job {
                    k,
                    kernel: *kernel,
                    a: Operand::Packed(&buf[..len]),
                    b: Operand::Packed(words),
                    c: c.as_raw_mut(),
                    accumulate: false,
                    epilogue: None,
                };
                job.run(1, true);
            });
        }
    }
}

/// The exps of [`softmax_product`] for one row, as bf16 pairs in `dst` (zero past them),
/// returning their f32 sum; by the packer's route (`Isa::Avx512Bf16`, or the scalar twin).
fn exp_pairs(isa: Isa, row: &[f32], scale: f32, dst: &mut [u32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Bf16 {
        // SAFETY: the route is AVX512-BF16 only on a CPU that has it.
        return unsafe { avx512bf16::exp_pairs(row, scale, dst) };
    }
    let _ = isa;
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e = |j: usize| row.get(j).map_or(0.0, |&x| crate::simd::math::exp_neg((x - max) * scale));
    let mut sum = 0.0;
    for (w, d) in dst.iter_mut().enumerate() {
        let (lo, hi) = (e(2 * w), e(2 * w + 1));
        sum += lo + hi;
        *d = pair(lo, hi);
    }
    sum
}

thread_local! {
    /// [`softmax_product`]'s probabilities as bf16 pairs, kept between calls.
    static PAIRS: std::cell::RefCell<Lines<u32>> = std::cell::RefCell::new(Lines::zeros(0));
}

/// `C = [C +] A · B` by the `gemm` crate's f32 kernels (on bf16-rounded operands).
fn portable_gemm(a: Mat<&[f32]>, b: Mat<&[f32]>, mut c: Mat<&mut [f32]>, accumulate: bool, threads: usize) {
    let (m, n, k) = (c.rows(), c.cols(), a.cols());
    assert!(a.rows() == m && b.rows() == k && b.cols() == n, "portable_gemm: shapes");
    if k == 0 {
        if !accumulate {
            (0..m).for_each(|i| c.row_mut(i).fill(0.0));
        }
        return;
    }
    let product = Gemm::new(m, n, k).accumulate(accumulate);
    let product = if threads > 1 { product.on_rayon(threads) } else { product };
    let (a, b, c) = (a.as_raw(), b.as_raw(), c.as_raw_mut());
    // SAFETY: the views hold m×k, k×n and m×n elements (checked when they were made from their
    // slices, borrowed for this call, C's mutably, its rows apart).
    unsafe {
        product.run(Strided::rows(c.ptr(), c.stride()), Strided::rows(a.ptr(), a.stride()), Strided::rows(b.ptr(), b.stride()));
    }
}

// ---------------------------------------------------------------------------------------------
// Blocked driver (fast path). It runs only for `Store::Panels`, whose kernel (AVX512-BF16 or
// tiles) it takes without asking again.
// ---------------------------------------------------------------------------------------------

thread_local! {
    /// Per-thread packing buffers, kept between calls (up to ~1 MiB): no allocation, zeroing
    /// or page faults per call, which matters for the small per-tile calls of a convolution.
    /// On a cache line, as the tiles need (`Lines`); A's block starts it.
    static SCRATCH: std::cell::RefCell<Lines<u32>> = std::cell::RefCell::new(Lines::zeros(0));
}

fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u32]) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < len {
                *v = Lines::zeros(len);
            }
            f(&mut v[..len])
        }
        // Re-entered on this thread (cannot happen today: nothing inside waits on rayon).
        Err(_) => f(&mut Lines::zeros(len)),
    })
}

#[derive(Clone, Copy)]
enum Operand<'a> {
    /// Whole K, `kernel.pairs(k)` pairs: A as rows (`convert_rows`), B as NR-column panels.
    Packed(&'a [u32]),
    /// A's rows of `kernel.pairs(k)` pairs, the given number of words apart ([`Pairs`]).
    Rows(&'a [u32], usize),
    /// f32: A as m×k, B as k×n.
    F32(Mat<&'a [f32]>),
}

/// One product on the fast path. Made only by `gemm_bf16` and `gemm_bf16_packed_a` from
/// operands packed for `kernel` (so the CPU has it, or it is the emulation), with `c` their C,
/// borrowed mutably for as long as the job, its rows apart (a `Mat<&mut [f32]>`'s promise).
struct Job<'a> {
    k: usize,
    kernel: Kernel,
    a: Operand<'a>,
    b: Operand<'a>,
    c: MatMut<f32>,
    accumulate: bool,
    /// Tiles only: the bias (and GELU) applied as the last k block leaves the tiles.
    epilogue: Option<Epilogue<'a>>,
}

// SAFETY: the tasks sharing a job read its operands and write C only through disjoint (row range
// × column range) rectangles, one per task (`Job::run`).
unsafe impl Sync for Job<'_> {}

/// A rectangle's blocking: k pairs per k block, rows of A and columns of B packed per block.
#[derive(Clone, Copy)]
struct Blocking {
    kc_pairs: usize,
    mc: usize,
    nc: usize,
}

impl Job<'_> {
    fn run(&self, threads: usize, split_m: bool) {
        let (m, n) = (self.c.rows(), self.c.cols());
        let threads = threads.max(1);
        let (len, unit) = if split_m { (m, self.kernel.mr()) } else { (n, NR) };
        let units = len.div_ceil(unit);
        let parts = threads.min(units);
        if parts <= 1 {
            self.run_rect(0..m, 0..n);
            return;
        }
        // Equal contiguous ranges, in whole panels so only the last range has a tail.
        let bounds: Vec<(usize, usize)> = (0..parts).map(|t| ((units * t / parts * unit).min(len), (units * (t + 1) / parts * unit).min(len))).collect();
        bounds.into_par_iter().with_max_len(1).for_each(|(lo, hi)| if split_m { self.run_rect(lo..hi, 0..n) } else { self.run_rect(0..m, lo..hi) });
    }

    /// Rows `rows` × columns `cols` of C, one task's alone; rows start at a multiple of the
    /// kernel's rows, columns of NR.
    fn run_rect(&self, rows: Range<usize>, cols: Range<usize>) {
        let kps_total = self.kernel.pairs(self.k);
        let tiles = matches!(self.kernel, Kernel::Tiles { .. });
        let (kc, tile) = (if tiles { tiles::KC } else { KC }, self.kernel.pair_unit());
        // Equal k blocks of at most KC (K = 1536 → 2 × 768, not 1024 + 512), in whole tiles.
        let kc_pairs = kps_total.div_ceil(kps_total.div_ceil(kc / 2).max(1)).next_multiple_of(tile).max(1);
        let (mc, nc) = if tiles {
            // All of the rectangle's rows at once (A converted once per k block), and as many
            // columns as keep B's block in L2 (`tiles::B_BLOCK_BYTES`).
            (rows.len().next_multiple_of(tiles::TM).max(tiles::TM), (tiles::B_BLOCK_BYTES / (kc_pairs * 4)).max(NR) / NR * NR)
        } else {
            // A converted per call: pack MC rows at a time; pre-packed: use it in place.
            let mr = self.kernel.mr();
            let cap = (A_BLOCK_BYTES / (kc_pairs * 4)).max(mr) / mr * mr;
            let mc = rows.len().div_ceil(rows.len().div_ceil(cap)).next_multiple_of(mr).max(mr);
            (mc, if matches!(self.b, Operand::F32(_)) { NC } else { cols.len() })
        };
        if self.k == 0 {
            if !self.accumulate {
                for i in rows {
                    // SAFETY: row i's columns `cols` are in C and this task's alone (`run`).
                    unsafe { std::slice::from_raw_parts_mut(self.c.at(i, cols.start), cols.len()).fill(0.0) };
                }
            }
            return;
        }
        let alen = if matches!(self.a, Operand::F32(_)) { mc * if tiles { tile_a_stride(kc_pairs) } else { kc_pairs } } else { 0 };
        let blen = if matches!(self.b, Operand::F32(_)) { nc.div_ceil(NR) * NR * kc_pairs } else { 0 };
        with_scratch(alen + blen, |buf| {
            let (abuf, bbuf) = buf.split_at_mut(alen);
            let blocking = Blocking { kc_pairs, mc, nc };
            if tiles {
                self.run_tile_blocks(rows, cols, blocking, abuf, bbuf)
            } else {
                self.run_blocks(rows, cols, blocking, abuf, bbuf)
            }
        });
    }

    /// B's k block (`kps` pairs from `kp0`) for columns `cols`, one row per panel of NR columns:
    /// the pre-packed panels in place, or the f32 columns packed into `bbuf`.
    fn b_block(&self, cols: Range<usize>, kp0: usize, kps: usize, bbuf: &mut [u32]) -> MatRef<u32> {
        let kps_total = self.kernel.pairs(self.k);
        let (b, bstride) = match self.b {
            Operand::Packed(p) => (&p[(cols.start / NR) * kps_total * NR + kp0 * NR..], kps_total * NR),
            Operand::F32(b) => {
                let k0 = 2 * kp0;
                pack_cols(self.kernel.packer(), b.block(k0, cols.start, k_block(self.k, k0, kps), cols.len()), kps, NR, bbuf);
                self.kernel.finish_panels(&mut bbuf[..cols.len().div_ceil(NR) * kps * NR], kps);
                (&bbuf[..], kps * NR)
            }
            Operand::Rows(..) => unreachable!("gemm_bf16: B as rows of A"),
        };
        let panels = cols.len().div_ceil(NR);
        assert!(b.len() >= (panels - 1) * bstride + kps * NR, "gemm_bf16: B's block");
        Mat::from_ptr(b.as_ptr(), panels, kps * NR, bstride)
    }

    /// The tile route's loops: k blocks outer (A's block converted once, for all rows), then
    /// column blocks whose B stays in L2 while every row group passes (`tiles::block`). C is
    /// visited once per k block: once where K ≤ `tiles::KC` (all but the widest: fc2 of ViT-B
    /// and ViT-L, w3 of ViT-g).
    fn run_tile_blocks(&self, rows: Range<usize>, cols: Range<usize>, blocking: Blocking, abuf: &mut [u32], bbuf: &mut [u32]) {
        let Blocking { kc_pairs, nc, .. } = blocking;
        let kps_total = self.kernel.pairs(self.k);
        let packer = self.kernel.packer();
        let m = rows.len();
        for kp0 in (0..kps_total).step_by(kc_pairs) {
            let kps = kc_pairs.min(kps_total - kp0);
            let k0 = 2 * kp0;
            let (a, astride) = match self.a {
                Operand::Packed(p) => (&p[rows.start * kps_total + kp0..], kps_total),
                Operand::Rows(p, stride) => (&p[rows.start * stride + kp0..], stride),
                Operand::F32(a) => {
                    let ld = tile_a_stride(kps);
                    convert_rows_at(packer, a.block(rows.start, k0, m, k_block(self.k, k0, kps)), kps, ld, abuf);
                    (&abuf[..], ld)
                }
            };
            // The tiles read A's rows to the next 16 (padding, or this block's buffer).
            assert!(a.len() >= (self.kernel.rows(m) - 1) * astride + kps, "gemm_bf16: A's block");
            let a = Mat::from_ptr(a.as_ptr(), m, kps, astride);
            let load_c = self.accumulate || kp0 > 0;
            for jc in cols.clone().step_by(nc) {
                let jc1 = (jc + nc).min(cols.end);
                let b = self.b_block(jc..jc1, kp0, kps, bbuf);
                let c = self.c.block(rows.start, jc, m, jc1 - jc);
                // The epilogue on the last k block: the bias (and the residual) of these columns
                // (and rows).
                let epilogue = self.epilogue.filter(|_| kp0 + kps == kps_total).map(|e| Epilogue {
                    bias: &e.bias[jc..jc1],
                    residual: e.residual.map(|(g, r)| (&g[jc..jc1], r.block(rows.start, jc, m, jc1 - jc))),
                    bf16: e.bf16.map(|o| o.block(rows.start, jc, m, jc1 - jc)),
                    ..e
                });
                // SAFETY: a tile job exists only for operands packed for the tiles, on a CPU
                // that has them (or emulated); A's and B's blocks are inside their buffers
                // (asserted), and C's block inside this task's rectangle (`run`).
                unsafe {
                    #[cfg(target_arch = "x86_64")]
                    if self.kernel == (Kernel::Tiles { emulated: false }) {
                        let mut unit = crate::simd::amx::Amx::new().expect("a tile job on a CPU without usable AMX");
                        tiles::block(&mut unit, a, b, c, load_c, epilogue);
                        continue;
                    }
                    tiles::block(&mut crate::simd::tiles::Emulated::default(), a, b, c, load_c, epilogue)
                }
            }
        }
    }

    fn run_blocks(&self, rows: Range<usize>, cols: Range<usize>, blocking: Blocking, abuf: &mut [u32], bbuf: &mut [u32]) {
        let Blocking { kc_pairs, mc, nc } = blocking;
        let kps_total = self.kernel.pairs(self.k);
        let packer = self.kernel.packer();
        for jc in cols.clone().step_by(nc) {
            let jc1 = (jc + nc).min(cols.end);
            for kp0 in (0..kps_total).step_by(kc_pairs) {
                let kps = kc_pairs.min(kps_total - kp0);
                let k0 = 2 * kp0;
                let b = self.b_block(jc..jc1, kp0, kps, bbuf);
                let load_c = self.accumulate || kp0 > 0;
                for ic in rows.clone().step_by(mc) {
                    let ic1 = (ic + mc).min(rows.end);
                    let (a, astride) = match self.a {
                        Operand::Packed(p) => (&p[ic * kps_total + kp0..], kps_total),
                        Operand::Rows(p, stride) => (&p[ic * stride + kp0..], stride),
                        Operand::F32(a) => {
                            convert_rows(packer, a.block(ic, k0, ic1 - ic, k_block(self.k, k0, kps)), kps, abuf);
                            (&abuf[..], kps)
                        }
                    };
                    assert!(a.len() >= (ic1 - ic - 1) * astride + kps, "gemm_bf16: A's block");
                    let a = Mat::from_ptr(a.as_ptr(), ic1 - ic, kps, astride);
                    let c = self.c.block(ic, jc, ic1 - ic, jc1 - jc);
                    // SAFETY: a job exists only for operands packed for its kernel, on a CPU
                    // that has it (or emulated); A's and B's blocks are inside their buffers
                    // (asserted), and C's block inside this task's rectangle (`run`).
                    unsafe {
                        match self.kernel {
                            Kernel::Mmla { emulated } => mmla::block(a, b, c, load_c, mmla_tile(emulated)),
                            _ => block(a, b, c, load_c),
                        }
                    }
                }
            }
        }
    }
}

/// All microkernel tiles of C (`c`) for one k block: A (`a`) its rows' k pairs, B (`b`) one row
/// per NR columns of C, its panel's k pairs (NR words each).
///
/// # Safety
/// The CPU has AVX512-BF16; every element of `a` and `b` is readable and every element of `c`
/// writable.
unsafe fn block(a: MatRef<u32>, b: MatRef<u32>, c: MatMut<f32>, load_c: bool) {
    // Row panels of equal height (≤ MR): 64 rows → 6 × 10-11 rather than 5 × 12 + 4, since a
    // 4-row tile has too few accumulators to hide the `vdpbf16ps` latency.
    let (rows, cols) = (c.rows(), c.cols());
    let np = rows.div_ceil(MR);
    // B micro-panel outer: it is reused by every A panel while they stream from L2.
    for (jp, j) in (0..cols).step_by(NR).enumerate() {
        let nv = (cols - j).min(NR);
        for p in 0..np {
            let (r0, r1) = (rows * p / np, rows * (p + 1) / np);
            let (at, ct) = (a.block(r0, 0, r1 - r0, a.cols()), c.block(r0, j, r1 - r0, nv));
            #[cfg(target_arch = "x86_64")]
            {
                // SAFETY: the caller's promise, for one tile of it: rows r0..r1 of A and C,
                // panel jp of B (a row of `b`) and its nv columns of C.
                unsafe { avx512bf16::kernel(at, b.row(jp), ct, load_c) };
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (at, ct, b, load_c, jp);
        }
    }
}

/// The register tile of the multiply-add route: `bfmmla` (`neon.rs`), or its portable twin.
fn mmla_tile(emulated: bool) -> mmla::Tile {
    #[cfg(target_arch = "aarch64")]
    if !emulated {
        return neon::kernel;
    }
    assert!(emulated, "the bfmmla route exists only on aarch64");
    mmla::kernel_emulated
}

// ---------------------------------------------------------------------------------------------
// AVX512-BF16 code.
// ---------------------------------------------------------------------------------------------

#[cfg(target_arch = "x86_64")]
mod avx512bf16;
mod mmla;
#[cfg(target_arch = "aarch64")]
mod neon;
mod tiles;

// ---------------------------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    /// `--precision auto` on the CPU is bf16 exactly on AMX, and where the products are native
    /// and the CPU is not Intel's (where AVX512-BF16 ran slower than f32), at every level this
    /// machine has.
    #[test]
    fn auto_is_bf16_only_where_it_pays() {
        for level in isa::levels() {
            isa::with_isa(level, || {
                let auto = crate::model::Precision::auto(&candle_core::Device::Cpu);
                let bf16 = level == Isa::Amx || (level == Isa::Avx512Bf16 && !isa::intel());
                assert_eq!(pays(), bf16, "{level}");
                assert_eq!(auto == crate::model::Precision::Bf16, bf16, "{level}: auto is {auto:?}");
            });
        }
    }

    use crate::test_rng::Rng;

    /// f64 reference on bf16-rounded inputs: C = [C0 +] A·B; A m×k (lda), B k×n row-major.
    fn reference(a: &[f32], lda: usize, b: &[f32], m: usize, n: usize, k: usize, c0: Option<(&[f32], usize)>) -> Vec<f64> {
        let mut out = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                for kk in 0..k {
                    s += round_bf16(a[i * lda + kk]) as f64 * round_bf16(b[kk * n + j]) as f64;
                }
                if let Some((c, ldc)) = c0 {
                    s += c[i * ldc + j] as f64;
                }
                out[i * n + j] = s;
            }
        }
        out
    }

    /// Max |got − ref| relative to the output scale (max |ref|, or the sum of |terms| scale).
    fn rel_err(got: &[f32], ldc: usize, want: &[f64], m: usize, n: usize, k: usize) -> f64 {
        // Output scale: typical magnitude of a sum of k products of U(-1,1) values ≈ sqrt(k)/3,
        // but use the max |ref| so the bound is about this matrix.
        let scale = want.iter().fold(0f64, |s, &x| s.max(x.abs())).max(1e-30);
        let _ = k;
        let mut e = 0f64;
        for i in 0..m {
            for j in 0..n {
                e = e.max((got[i * ldc + j] as f64 - want[i * n + j]).abs());
            }
        }
        e / scale
    }

    const SHAPES: &[(usize, usize, usize)] = &[
        (1, 1, 1),
        (1, 1, 2),
        (3, 5, 7),
        (12, 32, 16),
        (13, 33, 17),
        (11, 31, 255),
        (25, 70, 257),
        (37, 95, 513),
        (100, 64, 600),
        (7, 200, 1031),
        (130, 17, 64),
        (400, 100, 96),
        (5, 600, 9),
        (5, 40, 4099),  // K blocking: 2 blocks
        (61, 33, 8201), // 3 k blocks, 2 row blocks
    ];

    /// The distinct routes of this module at the levels this machine can run, lowest first.
    fn routes() -> Vec<Isa> {
        let mut r: Vec<Isa> = isa::levels().map(route).collect();
        r.dedup();
        r
    }

    /// The kernels of [`routes`] (`None`: the portable fallback), and the tiles' emulation on
    /// every machine, last.
    fn kernels() -> Vec<Option<Kernel>> {
        let mut k: Vec<Option<Kernel>> = routes().into_iter().map(Kernel::of).collect();
        k.push(Some(Kernel::Tiles { emulated: true }));
        k.push(Some(Kernel::Mmla { emulated: true }));
        k
    }

    fn check_gemm_bf16(level: Option<Kernel>) {
        let mut worst = 0f64;
        let mut rng = Rng::new(0x1234_5678_9abc_def1);
        for &(m, n, k) in SHAPES {
            for &(accumulate, pad) in &[(false, 0usize), (true, 3usize), (false, 5), (true, 0)] {
                for threads in [1, 2, 3] {
                    let lda = k + pad;
                    let ldc = n + 2 * pad;
                    let a = rng.units(m * lda);
                    let bkn = rng.units(k * n);
                    // Also test the (n, k) constructor on the transposed copy.
                    let mut bnk = vec![0f32; n * k];
                    for kk in 0..k {
                        for j in 0..n {
                            bnk[j * k + kk] = bkn[kk * n + j];
                        }
                    }
                    let c0 = rng.units(m * ldc);
                    let want = reference(&a, lda, &bkn, m, n, k, accumulate.then_some((&c0[..], ldc)));
                    for (ti, pb) in [PackedB::build_for(&bkn, k, n, false, level), PackedB::build_for(&bnk, k, n, true, level)].iter().enumerate() {
                        let mut c = c0.clone();
                        gemm_bf16(Mat::from_slice(&a, m, k, lda), pb, Mat::from_slice_mut(&mut c, m, n, ldc), accumulate, threads);
                        let e = rel_err(&c, ldc, &want, m, n, k);
                        worst = worst.max(e);
                        assert!(e <= 1e-5, "gemm_bf16 {level:?} {m}×{n}×{k} acc={accumulate} pad={pad} thr={threads} nk={ti}: rel err {e:e}");
                        // Padding between rows of C is untouched.
                        for i in 0..m {
                            assert_eq!(&c[i * ldc + n..(i + 1) * ldc], &c0[i * ldc + n..(i + 1) * ldc]);
                        }
                    }
                }
            }
        }
        eprintln!("gemm_bf16 {level:?}: worst rel err {worst:e}");
    }

    fn check_packed_a(level: Option<Kernel>) {
        let mut worst = 0f64;
        let mut rng = Rng::new(0x0fed_cba9_8765_4321);
        for &(m, n, k) in SHAPES {
            for &(accumulate, pad) in &[(false, 0usize), (true, 3usize), (false, 5), (true, 0)] {
                for threads in [1, 2, 3] {
                    let ldb = n + pad;
                    let ldc = n + 2 * pad;
                    let a = rng.units(m * k);
                    let b = rng.units(k * ldb);
                    let bdense: Vec<f32> = (0..k).flat_map(|kk| b[kk * ldb..kk * ldb + n].to_vec()).collect();
                    let c0 = rng.units(m * ldc);
                    let want = reference(&a, k, &bdense, m, n, k, accumulate.then_some((&c0[..], ldc)));
                    let pa = PackedA::build_for(&a, m, k, level);
                    let mut c = c0.clone();
                    gemm_bf16_packed_a(&pa, Mat::from_slice(&b, k, n, ldb), Mat::from_slice_mut(&mut c, m, n, ldc), accumulate, threads);
                    let e = rel_err(&c, ldc, &want, m, n, k);
                    worst = worst.max(e);
                    assert!(e <= 1e-5, "packed_a {level:?} {m}×{n}×{k} acc={accumulate} pad={pad} thr={threads}: rel err {e:e}");
                    for i in 0..m {
                        assert_eq!(&c[i * ldc + n..(i + 1) * ldc], &c0[i * ldc + n..(i + 1) * ldc]);
                    }
                }
            }
        }
        eprintln!("gemm_bf16_packed_a {level:?}: worst rel err {worst:e}");
    }

    #[test]
    fn gemm_bf16_matches_reference_on_every_route() {
        for r in kernels() {
            check_gemm_bf16(r);
        }
    }

    #[test]
    fn packed_a_matches_reference_on_every_route() {
        for r in kernels() {
            check_packed_a(r);
        }
    }

    /// A ViT-sized problem (several row blocks per thread, all 32-column panels full but the
    /// last, a K that is not a multiple of anything) against the f64 reference.
    #[test]
    fn large_matches_reference() {
        let mut rng = Rng::new(2024);
        let (m, n, k) = (301, 390, 1537);
        let a = rng.units(m * k);
        let b = rng.units(k * n);
        let want = reference(&a, k, &b, m, n, k, None);
        for r in kernels() {
            let mut c = vec![0f32; m * n];
            gemm_bf16(Mat::from_slice(&a, m, k, k), &PackedB::build_for(&b, k, n, false, r), Mat::from_slice_mut(&mut c, m, n, n), false, 2);
            let e = rel_err(&c, n, &want, m, n, k);
            eprintln!("large {m}×{n}×{k} {r:?}: rel err {e:e}");
            assert!(e <= 1e-5, "large {r:?}: rel err {e:e}");
            let mut c = vec![0f32; m * n];
            gemm_bf16_packed_a(&PackedA::build_for(&a, m, k, r), Mat::from_slice(&b, k, n, n), Mat::from_slice_mut(&mut c, m, n, n), false, 2);
            let e = rel_err(&c, n, &want, m, n, k);
            assert!(e <= 1e-5, "large packed_a {r:?}: rel err {e:e}");
        }
    }

    /// Attention's softmax and product (`softmax_product`) on every kernel this machine has and
    /// the tiles' emulation, against softmax(scale · S) · B in f64: row sums, odd k (a half pair),
    /// rows past one tile and a B packed from a strided view (`build_view`), with the buffer
    /// left dirty by a larger call first so its padding rows must be cleared.
    #[test]
    fn softmax_product_matches_reference_on_every_route() {
        let mut rng = Rng::new(0x5eed_50f7);
        for r in kernels() {
            for &(m, k, n) in &[(40usize, 1801usize, 64usize), (7, 33, 24), (1, 1, 1), (17, 130, 40), (3, 64, 16)] {
                let s: Vec<f32> = rng.units(m * k).iter().map(|v| 8.0 * v).collect();
                // B as every third row of a wider matrix (k rows of n at stride 3n).
                let wide = rng.units(3 * k * n);
                let view = Mat::from_slice(&wide, k, n, 3 * n);
                let b = PackedB::pack(view, k, n, false, r);
                let scale = 0.125f32;
                let mut c = vec![f32::NAN; m * n];
                let mut sums = vec![0f32; m];
                softmax_product(Mat::from_slice(&s, m, k, k), scale, &b, Mat::from_slice_mut(&mut c, m, n, n), &mut sums);
                let mut worst = 0f64;
                for i in 0..m {
                    let row = &s[i * k..][..k];
                    let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
                    let e: Vec<f64> = row.iter().map(|&x| ((x as f64 - max) * scale as f64).exp()).collect();
                    let z: f64 = e.iter().sum();
                    assert!((sums[i] as f64 - z).abs() <= 1e-5 * z, "{r:?} {m}x{k}x{n} row {i}: sum {} vs {z}", sums[i]);
                    for j in 0..n {
                        let want: f64 = (0..k).map(|kk| e[kk] * wide[kk * 3 * n + j] as f64).sum::<f64>() / z;
                        let got = c[i * n + j] as f64 / sums[i] as f64;
                        worst = worst.max((got - want).abs());
                    }
                }
                eprintln!("softmax_product {r:?} {m}x{k}x{n}: worst {worst:e}");
                // Probabilities and B rounded to bf16 (2^-9 each) over values of magnitude ≤ 1.
                assert!(worst <= 8e-3, "{r:?} {m}x{k}x{n}: worst {worst:e}");
            }
        }
    }

    /// The product with its bias and GELU (`gemm_bf16_bias`) on every kernel this machine has
    /// and the tiles' emulation: C's old contents (NaN) never read, past one k block too.
    #[test]
    fn bias_and_gelu_match_reference() {
        let mut rng = Rng::new(4242);
        for &(m, n, k) in &[(1usize, 1usize, 1usize), (33, 70, 300), (45, 96, 8201)] {
            let a = rng.units(m * k);
            let b = rng.units(k * n);
            let bias = rng.units(n);
            let want = reference(&a, k, &b, m, n, k, None);
            for kernel in kernels() {
                let pb = PackedB::build_for(&b, k, n, false, kernel);
                for gelu in [None, Some(isa::max())] {
                    let mut c = vec![f32::NAN; m * n];
                    gemm_bf16_bias(Mat::from_slice(&a, m, k, k), &pb, Mat::from_slice_mut(&mut c, m, n, n), &bias, gelu, 2);
                    let want: Vec<f64> = want
                        .iter()
                        .enumerate()
                        .map(|(e, &v)| v + bias[e % n] as f64)
                        .map(|v| if gelu.is_some() { crate::simd::math::gelu(v as f32) as f64 } else { v })
                        .collect();
                    let e = rel_err(&c, n, &want, m, n, k);
                    assert!(e <= 1e-5, "bias {kernel:?} gelu={gelu:?} {m}×{n}×{k}: rel err {e:e}");
                    // The same product into a buffer of its own (never zeroed on the tiles).
                    let y = linear_bf16(Mat::from_slice(&a, m, k, k), &pb, &bias, gelu, 2);
                    assert!(y.len() == m * n && y.iter().zip(&c).all(|(y, c)| y.to_bits() == c.to_bits()), "linear_bf16 {kernel:?} gelu={gelu:?} {m}×{n}×{k}");
                }
            }
        }
    }

    /// The product with its bias, LayerScale and residual (`linear_bf16_residual`) on every
    /// kernel this machine has and the tiles' emulation, against f64: rows and columns past
    /// whole groups, a residual read through a stride, past one k block too.
    #[test]
    fn layerscale_residual_matches_reference() {
        let mut rng = Rng::new(0x1a5c_a1e5);
        for &(m, n, k) in &[(1usize, 1usize, 1usize), (33, 70, 300), (45, 96, 4100)] {
            let a = rng.units(m * k);
            let b = rng.units(k * n);
            let bias = rng.units(n);
            let gamma = rng.units(n);
            // The residual as the first n of each row of 2n.
            let wide = rng.units(m * 2 * n);
            let res = Mat::from_slice(&wide, m, n, 2 * n);
            let product = reference(&a, k, &b, m, n, k, None);
            let want: Vec<f64> =
                product.iter().enumerate().map(|(e, &v)| wide[(e / n) * 2 * n + e % n] as f64 + gamma[e % n] as f64 * (v + bias[e % n] as f64)).collect();
            for kernel in kernels() {
                let pb = PackedB::build_for(&b, k, n, false, kernel);
                let y = linear_bf16_residual(Mat::from_slice(&a, m, k, k), &pb, &bias, &gamma, res, 2);
                assert_eq!(y.len(), m * n);
                let e = rel_err(&y, n, &want, m, n, k);
                assert!(e <= 1e-5, "{kernel:?} {m}×{n}×{k}: rel err {e:e}");
            }
        }
    }

    /// An MLP through bf16 pairs (`linear_bf16_pairs` then `linear_bf16_residual_pairs`) on
    /// the tiles (hardware where the CPU has it, and the emulation) gives the f32 route's bits:
    /// the pairs are its output rounded, the second product the same as from its f32 output.
    /// Rows past whole groups and not whole tiles; where the pairs do not apply (columns not a
    /// multiple of 32, K past one block, other kernels), `None`.
    #[test]
    fn an_mlp_through_pairs_gives_the_same_bits() {
        let mut rng = Rng::new(0x5eed_0fb1);
        for &(m, d, h) in &[(1usize, 16usize, 32usize), (45, 48, 96), (77, 130, 256)] {
            let x = rng.units(m * d);
            let (w1, w2) = (rng.units(h * d), rng.units(d * h));
            let (b1, b2, gamma) = (rng.units(h), rng.units(d), rng.units(d));
            let res = rng.units(m * d);
            let gelu = Some(Isa::Portable);
            for kernel in kernels() {
                let (p1, p2) = (PackedB::build_for(&w1, d, h, true, kernel), PackedB::build_for(&w2, h, d, true, kernel));
                let pairs = linear_bf16_pairs(Mat::from_slice(&x, m, d, d), &p1, &b1, gelu, 2);
                let Some(pairs) = pairs else {
                    assert!(!matches!(kernel, Some(Kernel::Tiles { .. })), "{kernel:?}: no pairs on the tiles");
                    continue;
                };
                let hidden = linear_bf16(Mat::from_slice(&x, m, d, d), &p1, &b1, gelu, 2);
                let kernel = kernel.expect("the tiles");
                let PairsLayout { kps, stride, rows } = pairs.layout;
                assert_eq!((kps, rows, pairs.m), (kernel.pairs(h), kernel.rows(m), m));
                assert!(stride >= kps && (stride / 16) % 2 == 1 && pairs.words.len() >= rows * stride, "{:?}", pairs.layout);
                for (i, row) in hidden.chunks(h).enumerate() {
                    let want: Vec<u32> = row.chunks(2).map(|p| pair(p[0], p[1])).collect();
                    assert_eq!(&pairs.words[i * stride..i * stride + h / 2], &want[..], "{kernel:?} {m}×{d}×{h}: row {i}");
                    assert!(pairs.words[i * stride + h / 2..(i + 1) * stride].iter().all(|&w| w == 0), "{kernel:?}: row {i}'s tail");
                }
                assert!(pairs.words[m * stride..rows * stride].iter().all(|&w| w == 0), "{kernel:?}: the padding rows");
                let resm = Mat::from_slice(&res, m, d, d);
                let want = linear_bf16_residual(Mat::from_slice(&hidden, m, h, h), &p2, &b2, &gamma, resm, 2);
                let got = linear_bf16_residual_pairs(&pairs, &p2, &b2, &gamma, resm, 2);
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{kernel:?} {m}×{d}×{h}: the second product");
            }
        }
        // Not taken: 48 columns, and K past one k block.
        for kernel in kernels().into_iter().filter(|k| matches!(k, Some(Kernel::Tiles { .. }))) {
            let (m, d) = (5, 16);
            let x = rng.units(m * 4200);
            assert!(
                linear_bf16_pairs(Mat::from_slice(&x, m, d, d), &PackedB::build_for(&rng.units(48 * d), d, 48, true, kernel), &[0.0; 48], None, 2).is_none()
            );
            assert!(linear_bf16_pairs(
                Mat::from_slice(&x, m, 4200, 4200),
                &PackedB::build_for(&rng.units(32 * 4200), 4200, 32, true, kernel),
                &[0.0; 32],
                None,
                2
            )
            .is_none());
        }
    }

    /// Zero-sized dimensions: nothing to do (k = 0: C = 0, or C unchanged when accumulating).
    #[test]
    fn empty_dims() {
        for r in kernels() {
            for &(m, n, k) in &[(0usize, 5usize, 3usize), (4, 0, 3), (4, 5, 0), (0, 0, 0)] {
                for accumulate in [false, true] {
                    let a = vec![1f32; m * k];
                    let b = vec![1f32; k * n];
                    let mut c = vec![7f32; m * n];
                    gemm_bf16(Mat::from_slice(&a, m, k, k), &PackedB::build_for(&b, k, n, false, r), Mat::from_slice_mut(&mut c, m, n, n), accumulate, 2);
                    let want = if accumulate { 7.0 } else { 0.0 } + k as f32;
                    assert!(c.iter().all(|&x| x == want), "gemm_bf16 {m}×{n}×{k} acc={accumulate} {r:?}");
                    let mut c = vec![7f32; m * n];
                    gemm_bf16_packed_a(&PackedA::build_for(&a, m, k, r), Mat::from_slice(&b, k, n, n), Mat::from_slice_mut(&mut c, m, n, n), accumulate, 2);
                    assert!(c.iter().all(|&x| x == want), "packed_a {m}×{n}×{k} acc={accumulate} {r:?}");
                }
            }
        }
    }

    /// Operands packed at every level (through `isa::with_isa`, as the model packs its weights)
    /// take that level's route, and agree with the portable route: bit for bit where the route
    /// is the portable one, within the bf16 GEMM's tolerance elsewhere.
    #[test]
    fn every_level_matches_portable() {
        let mut rng = Rng::new(42);
        let (m, n, k) = (77, 129, 301);
        let a = rng.units(m * k);
        let b = rng.units(k * n);
        let run = |level: Isa| {
            let (pb, pa) = isa::with_isa(level, || (PackedB::from_f32_kn(&b, k, n), PackedA::from_f32(&a, m, k)));
            assert_eq!((pb.isa(), pa.isa()), (route(level), route(level)), "{level}");
            let (mut c1, mut c2) = (vec![0f32; m * n], vec![0f32; m * n]);
            gemm_bf16(Mat::from_slice(&a, m, k, k), &pb, Mat::from_slice_mut(&mut c1, m, n, n), false, 2);
            gemm_bf16_packed_a(&pa, Mat::from_slice(&b, k, n, n), Mat::from_slice_mut(&mut c2, m, n, n), false, 2);
            (c1, c2)
        };
        let portable = run(Isa::Portable);
        let scale = portable.0.iter().fold(0f32, |s, &x| s.max(x.abs())).max(1e-30);
        for level in isa::levels() {
            let got = run(level);
            for (what, g, p) in [("gemm_bf16", &got.0, &portable.0), ("packed_a", &got.1, &portable.1)] {
                if route(level) == Isa::Portable {
                    assert!(g == p, "{what} at {level}: not the portable bits");
                } else {
                    let e = g.iter().zip(p).fold(0f32, |s, (x, y)| s.max((x - y).abs())) / scale;
                    eprintln!("{what} {level} vs portable: rel diff {e:e}");
                    assert!(e <= 1e-5, "{what} {level} vs portable: rel err {e:e}");
                }
            }
        }
    }

    /// The vector packers give exactly what the scalar reference packers give.
    #[test]
    fn packers_match_scalar() {
        for r in routes() {
            check_packers(r);
        }
    }

    fn check_packers(r: Isa) {
        let mut rng = Rng::new(99);
        for &(rows, k, ld_pad, k0, kps) in &[(5usize, 37usize, 3usize, 0usize, 19usize), (33, 100, 0, 32, 30), (40, 64, 1, 0, 40), (3, 7, 0, 4, 8)] {
            let ld = k + ld_pad;
            let src = rng.units(rows * ld);
            let mut want = vec![7u32; rows * kps];
            let mut got = vec![9u32; rows * kps];
            let k1 = (k0 + 2 * kps).min(k);
            for r in 0..rows {
                for kp in 0..kps {
                    let (ka, kb) = (k0 + 2 * kp, k0 + 2 * kp + 1);
                    want[r * kps + kp] = if ka < k1 { pair(src[r * ld + ka], if kb < k1 { src[r * ld + kb] } else { 0.0 }) } else { 0 };
                }
            }
            let block = Mat::from_slice(&src, rows, k, ld).block(0, k0, rows, k_block(k, k0, kps));
            convert_rows(r, block, kps, &mut got);
            assert_eq!(got, want, "convert_rows {r} {rows}×{k} k0={k0} kps={kps}");
            // B from rows (`pack_rows`, a Linear weight) against the scalar packer.
            let kps_r = kps;
            let panels_r = rows.div_ceil(NR);
            let mut got = vec![1u32; panels_r * kps_r * NR];
            let mut want = vec![2u32; panels_r * kps_r * NR];
            pack_rows(r, block, kps_r, NR, &mut got);
            pack_rows_scalar(block, kps_r, NR, &mut want);
            assert_eq!(got, want, "pack_rows {r} {rows}×{k} k0={k0} kps={kps}");
            // B as K×N (`pack_cols`): lines = columns of src viewed as k×ld.
            let (kk, n) = (rows, ld);
            let panels = (n - 1).div_ceil(NR).max(1);
            let (l0, l1) = (1, n);
            let kps_b = kk.div_ceil(2);
            let mut got = vec![0u32; panels * kps_b * NR];
            pack_cols(r, Mat::from_slice(&src, kk, ld, ld).block(0, l0, kk, l1 - l0), kps_b, NR, &mut got);
            for p in 0..panels {
                for kp in 0..kps_b {
                    for i in 0..NR {
                        let l = l0 + p * NR + i;
                        let w = if l < l1 { pair(src[2 * kp * ld + l], if 2 * kp + 1 < kk { src[(2 * kp + 1) * ld + l] } else { 0.0 }) } else { 0 };
                        assert_eq!(got[p * kps_b * NR + kp * NR + i], w, "pack_cols {r} p={p} kp={kp} i={i}");
                    }
                }
            }
        }
    }

    /// The vector conversion (vcvtne2ps2bf16) and the scalar one agree bit for bit, including
    /// ties, denormals, infinities and NaN.
    #[test]
    fn conversion_matches_hardware() {
        let mut vals: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-40,
            -1e-40,
            f32::from_bits(0x3f80_8000), // tie, even → down
            f32::from_bits(0x3f81_8000), // tie, odd → up
            f32::from_bits(0x7f7f_ffff), // rounds to inf
            f32::NAN,
        ];
        let mut rng = Rng::new(7);
        vals.extend((0..4000).map(|i| rng.unit() * 10f32.powi(i % 30 - 15)));
        while !vals.len().is_multiple_of(32) {
            vals.push(0.5);
        }
        let k = vals.len();
        for r in routes() {
            // One row of A packs into pairs in order.
            let mut p = vec![0u32; k.div_ceil(2)];
            convert_rows(r, Mat::from_slice(&vals, 1, k, k), k.div_ceil(2), &mut p);
            for (kk, &v) in vals.iter().enumerate() {
                let word = p[kk / 2];
                let got = if kk % 2 == 0 { word & 0xffff } else { word >> 16 } as u16;
                let want = f32_to_bf16(v);
                if v.is_nan() {
                    assert!(f32::from_bits((got as u32) << 16).is_nan());
                } else {
                    assert_eq!(got, want, "{r}: value {v:e} ({:#x})", v.to_bits());
                }
            }
        }
    }
}
