//! The submanifold 3x3x3 convolution of MoGe-3's refiner (upstream's `SparseConv3d` on
//! FlexGEMM, `moge/model/modules/flex_sparse_blocks.py`): outputs at the active voxels only,
//! inputs from active voxels only (a dense padded Conv3d evaluated at the active sites with the
//! inactive ones zero), the bias always added.
//!
//! Gather-GEMM-scatter per tap, output-stationary: the voxels are cut into chunks whose
//! outputs stay in cache; for each tap, the inputs of the chunk's voxels that have that
//! neighbour are gathered into a dense block, multiplied by the tap's (Ci × Co) weight on the
//! project's products (the `gemm` crate in f32, `matmul::bf16` in bf16, `matmul::int8` in
//! int8), and added into their rows. Absent taps cost nothing: a voxel of a surface has 6-14 of
//! its 27 neighbours, so a dense 27-tap im2col would do 2-4x the multiply-adds. The centre tap is every voxel itself:
//! its product reads the chunk's inputs in place and accumulates straight into the outputs.
//!
//! Where the CPU has AVX-512 (f32) or AVX512-BF16 (bf16), the products skip the gather and
//! the adds: a register tile reads each pair's input row and adds into its output row where
//! they lie ([`rows`]), the inputs converted to bf16 once a call. The gathered path stays for
//! the AMX tiles, Arm's `bfmmla`, the portable routes and int8.
//!
//! int8 as the decoder's convolutions (`conv3x3::int8`): weights per output channel (over its
//! 27 taps), inputs per voxel (asymmetric u8, quantised once a call, their rows gathered per tap),
//! int32 sums per tap scaled back to f32 before the rows' adds, so that each voxel keeps its
//! own scale. On a CPU without VNNI the same quantisation emulated through the f32 products.

use rayon::prelude::*;

use super::layer_norm::LayerNormOp;
use super::matmul::bf16::{self, gemm_bf16, PackedB};
use super::matmul::gemm::{Gemm, Strided};
use super::matmul::int8::{self, fake_quantised, product_quantised, quantise_activations, QuantA, QuantB, Route};
use crate::simd::isa::{self, Isa};
use crate::simd::math::{layer_norm_row, silu_in_place};
use crate::simd::{Lines, Mat, MatMut};

#[cfg(target_arch = "x86_64")]
mod avx512;
mod rows;
mod tiles;

use rows::{MultiTile, Panels, Tile};

/// Offsets of a 3x3x3 kernel.
pub const TAPS: usize = 27;
/// Offset (0, 0, 0): the voxel itself.
pub const CENTRE: usize = 13;
/// No active voxel at that offset.
pub const ABSENT: u32 = u32::MAX;

/// For each voxel, the index of the active voxel at each of the 27 offsets, or [`ABSENT`]
/// (FlexGEMM's neighbour cache, built once per level and shared by every convolution there).
/// Tap t = 9a + 3b + c is offset (a − 1, b − 1, c − 1) over (i, j, z), the order of upstream's
/// weight (Co, 3, 3, 3, Ci).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbours {
    map: Vec<u32>,
    /// Per tap, its (voxel, neighbour) pairs in the voxels' order: a chunk's pairs of a tap are
    /// one run of it, found by bisection (the rulebook, built once for every convolution of
    /// the level rather than by each of them per chunk).
    taps: Vec<Vec<(u32, u32)>>,
    /// (taps, voxel) of every voxel, each block of [`rows::GROUP_BLOCK`] voxels sorted by its
    /// taps: the groups of the row tiles for few channels, made when first asked for.
    by_taps: std::sync::OnceLock<Vec<(u32, u32)>>,
    /// The AMX route's groups of voxels and their inputs' rows, made when first asked for.
    tile_groups: std::sync::OnceLock<tiles::Groups>,
}

impl Neighbours {
    /// From 27 indices per voxel, each below the voxel count or [`ABSENT`], the centre the voxel
    /// itself. Panics otherwise (the voxel set builds it; a wrong map would read out of bounds).
    pub fn from_map(map: Vec<u32>) -> Self {
        assert!(map.len().is_multiple_of(TAPS), "neighbour map: {} entries, not 27 per voxel", map.len());
        let n = map.len() / TAPS;
        assert!(n < ABSENT as usize, "neighbour map: {n} voxels");
        // Checked and cut into each tap's pairs block by block in parallel, then each tap's
        // blocks joined in order.
        const BLOCK: usize = 16_384;
        let blocks: Vec<Vec<Vec<(u32, u32)>>> = map
            .par_chunks(BLOCK * TAPS)
            .enumerate()
            .map(|(b, block)| {
                let mut counts = [0usize; TAPS];
                for row in block.chunks_exact(TAPS) {
                    counts.iter_mut().zip(row).for_each(|(c, &s)| *c += usize::from(s != ABSENT));
                }
                let mut taps: Vec<Vec<(u32, u32)>> = counts.iter().map(|&c| Vec::with_capacity(c)).collect();
                for (r, row) in block.chunks_exact(TAPS).enumerate() {
                    let v = b * BLOCK + r;
                    assert!(row[CENTRE] as usize == v, "neighbour map: voxel {v} is not its own centre");
                    for (pairs, &s) in taps.iter_mut().zip(row) {
                        if s != ABSENT {
                            assert!((s as usize) < n, "neighbour map: voxel {v} names a voxel beyond {n}");
                            pairs.push((v as u32, s));
                        }
                    }
                }
                taps
            })
            .collect();
        let taps = (0..TAPS)
            .into_par_iter()
            .map(|t| {
                let mut pairs = Vec::with_capacity(blocks.iter().map(|b| b[t].len()).sum());
                blocks.iter().for_each(|b| pairs.extend_from_slice(&b[t]));
                pairs
            })
            .collect();
        Self { map, taps, by_taps: std::sync::OnceLock::new(), tile_groups: std::sync::OnceLock::new() }
    }

    /// Every voxel as (its taps as bits, the voxel), each block of [`rows::GROUP_BLOCK`] voxels
    /// in place and sorted by taps, then voxel: voxels with the same taps side by side.
    pub(crate) fn by_taps(&self) -> &[(u32, u32)] {
        self.by_taps.get_or_init(|| {
            let mut order: Vec<(u32, u32)> = Vec::with_capacity(self.len());
            order.spare_capacity_mut()[..self.len()].par_chunks_mut(rows::GROUP_BLOCK).enumerate().for_each(|(b, block)| {
                for (r, e) in block.iter_mut().enumerate() {
                    let v = b * rows::GROUP_BLOCK + r;
                    let mask = self.of(v).iter().enumerate().fold(0u32, |m, (t, &s)| m | u32::from(s != ABSENT) << t);
                    e.write((mask, v as u32));
                }
                // SAFETY: every element of the block was written just above.
                let block = unsafe { &mut *(block as *mut [std::mem::MaybeUninit<(u32, u32)>] as *mut [(u32, u32)]) };
                block.sort_unstable();
            });
            // SAFETY: the blocks cover all len() entries, each written by its task.
            unsafe { order.set_len(self.len()) };
            order
        })
    }

    /// The groups of the AMX route (`tiles::Groups`), made once for every convolution of the
    /// level.
    pub(crate) fn tile_groups(&self) -> &tiles::Groups {
        self.tile_groups.get_or_init(|| tiles::Groups::new(self))
    }

    /// Tap t's pairs whose voxel is in `voxels`, in order.
    pub(crate) fn pairs_in(&self, t: usize, voxels: std::ops::Range<usize>) -> &[(u32, u32)] {
        let pairs = &self.taps[t];
        let lo = pairs.partition_point(|&(v, _)| (v as usize) < voxels.start);
        let hi = lo + pairs[lo..].partition_point(|&(v, _)| (v as usize) < voxels.end);
        &pairs[lo..hi]
    }

    /// Voxels.
    pub fn len(&self) -> usize {
        self.map.len() / TAPS
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The 27 neighbours of voxel `v`.
    pub fn of(&self, v: usize) -> &[u32] {
        &self.map[v * TAPS..(v + 1) * TAPS]
    }

    /// (voxel, neighbour) pairs present, the centre included: the convolution's multiply-adds
    /// are `pairs · Ci · Co`.
    pub fn pairs(&self) -> usize {
        self.taps.iter().map(Vec::len).sum()
    }
}

/// The precision of a convolution's products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Products {
    F32,
    /// Both operands rounded to bf16, f32 sums.
    Bf16,
    /// Both quantised to 8 bits, int32 sums per tap (the module's documentation).
    Int8,
}

/// How a tap's (Ci × Co) weight is packed for the bf16 products.
type Pack<'a> = &'a dyn Fn(&[f32], usize, usize) -> PackedB;

/// The taps' weights in the products' form.
enum TapWeights {
    /// (27, Ci, Co) row-major.
    F32(Vec<f32>),
    /// One packed B per tap.
    Bf16(Vec<PackedB>),
    /// One int8 weight per tap, (Co × Ci) quantised per output channel for a VNNI route.
    Int8(Vec<QuantB>),
    /// int8's numbers on the f32 products: each tap's weight quantised and dequantised, laid out
    /// as `F32`'s; the inputs quantised and dequantised per voxel on every call.
    Int8Emulated(Vec<f32>),
    /// The row tiles on the f32 inputs as they are.
    F32Rows(RowTaps<f32>),
    /// The row tiles on bf16 pairs, the inputs converted once a call.
    Bf16Rows(RowTaps<u32>),
    /// The row tiles on int8 rows (`rows.rs`), the inputs quantised once a call.
    Int8Rows(RowTaps<u32>),
    /// The AMX tiles by groups of voxels (`tiles.rs`) on bf16 pairs converted once a call.
    Bf16Tiles(tiles::TileTaps),
}

/// The taps' weights for the row tiles, and the tiles.
struct RowTaps<T> {
    panels: Panels<T>,
    tile: Tile<T>,
    multi: MultiTile<T>,
    /// By groups of voxels with the same taps (`rows::accumulate_grouped`), else tap by tap.
    grouped: bool,
}

/// Input channels up to which the row tiles go by groups of voxels with the same taps. Measured
/// on Zen 4 (2 threads, the refiner's levels on a floor-and-wall scene, min of 8), bf16 per tap
/// against grouped: 104 / 102 GMAC/s at 32 channels, 146 / 170 at 64, 173 / 194 at 128, 178 /
/// 162 at 256, 195 / 92 at 512 (f32 alike): from 256 a tap's products are long beside the
/// outputs' pass, and a group's panels (a tap's weight each) no longer stay in cache.
const GROUPED_CI: usize = 128;

/// Input channels up to which bf16 on AMX runs by groups of voxels on the tiles (`tiles.rs`);
/// beyond, the gathered products. The refiner's levels on the floor-and-wall scene of
/// `examples/sparse_conv_bench` (Ci = Co, an Intel Xeon with AMX, 2 threads, 2026-12-07),
/// gathered products / groups on the tiles, GMAC/s: 32 channels 76-77 / 133-146, 64 205-217 /
/// 380-455, 128 409-432 / 734-773, 256 662-669 / 629-649 (another sitting 690-721 / 729-746:
/// even), 512 812-822 / 437-546 (each group reads every weight of its taps: 14 MiB at 512).
const TILES_MAX_CI: usize = 256;

/// `SparseConv3d(ci, co, 3)` as a submanifold convolution.
pub struct SubmConv3d {
    ci: usize,
    co: usize,
    bias: Vec<f32>,
    taps: TapWeights,
    /// The level of the vector loops (the rows' adds).
    isa: Isa,
}

impl SubmConv3d {
    /// From upstream's weight (Co, 3, 3, 3, Ci) and bias (Co), for products in `products` (the
    /// bias and the sums in f32 whatever they are).
    pub fn new(weight: &[f32], bias: Vec<f32>, ci: usize, co: usize, products: Products) -> Self {
        let level = isa::current();
        match products {
            Products::F32 if level >= Isa::Avx512 => Self::on_rows(weight, bias, ci, co, products, false),
            Products::Bf16 if bf16::route(level) == Isa::Avx512Bf16 => Self::on_rows(weight, bias, ci, co, products, false),
            Products::Bf16 if bf16::route(level) == Isa::Amx && ci <= TILES_MAX_CI => Self::on_tiles(weight, bias, ci, co, false),
            Products::F32 => Self::packed_by(weight, bias, ci, co, None),
            Products::Bf16 => Self::packed_by(weight, bias, ci, co, Some(&|b: &[f32], k, n| PackedB::from_f32_kn(b, k, n))),
            // int8 on AMX multiplies in bf16 on the tiles, as the decoder's convolutions do there
            // (`modules::conv_bf16`): the refiner at 560x832 took 0.61 s a call so, 0.87 s in
            // int8 on AVX512-VNNI (`examples/refiner_bench`, an Intel Xeon with AMX, 2026-12-07).
            Products::Int8 if bf16::route(level) == Isa::Amx => Self::new(weight, bias, ci, co, Products::Bf16),
            Products::Int8 if int8::route(level) == Route::Avx512Vnni => Self::on_rows(weight, bias, ci, co, products, false),
            // Elsewhere on the VNNI products (the tiles' int8 has no sparse gather).
            Products::Int8 => Self::quantised(weight, bias, ci, co, int8::route(isa::current()).without_tiles()),
        }
    }

    /// As [`SubmConv3d::new`], each tap's bf16 weight packed by `pack` (the tests choose the
    /// kernel: the tiles' emulation on machines without AMX).
    pub(crate) fn packed_by(weight: &[f32], bias: Vec<f32>, ci: usize, co: usize, pack: Option<Pack>) -> Self {
        Self::check(weight, &bias, ci, co);
        let taps = match pack {
            Some(pack) => TapWeights::Bf16((0..TAPS).map(|t| pack(&tap_kn(weight, ci, co, t), ci, co)).collect()),
            None => TapWeights::F32((0..TAPS).flat_map(|t| tap_kn(weight, ci, co, t)).collect()),
        };
        Self { ci, co, bias, taps, isa: isa::current() }
    }

    /// As [`SubmConv3d::new`] on the row tiles (f32 or bf16 products): the AVX-512 tiles, which
    /// the caller has checked this CPU has, or (`portable`) their twins.
    pub(crate) fn on_rows(weight: &[f32], bias: Vec<f32>, ci: usize, co: usize, products: Products, portable: bool) -> Self {
        Self::on_rows_grouped(weight, bias, ci, co, products, portable, ci <= GROUPED_CI)
    }

    /// As [`SubmConv3d::on_rows`], by groups of voxels with the same taps where `grouped`.
    pub(crate) fn on_rows_grouped(weight: &[f32], bias: Vec<f32>, ci: usize, co: usize, products: Products, portable: bool, grouped: bool) -> Self {
        Self::check(weight, &bias, ci, co);
        type Tiles<T> = (Tile<T>, MultiTile<T>);
        #[cfg(target_arch = "x86_64")]
        let (f32_tiles, bf16_tiles, int8_tiles): (Tiles<f32>, Tiles<u32>, Tiles<u32>) = if portable {
            (
                (rows::tile_f32_portable, rows::multi_f32_portable),
                (rows::tile_bf16_portable, rows::multi_bf16_portable),
                (rows::tile_int8_portable, rows::multi_int8_portable),
            )
        } else {
            ((avx512::tile_f32, avx512::multi_f32), (avx512::tile_bf16, avx512::multi_bf16), (avx512::tile_int8, avx512::multi_int8))
        };
        #[cfg(not(target_arch = "x86_64"))]
        let (f32_tiles, bf16_tiles, int8_tiles): (Tiles<f32>, Tiles<u32>, Tiles<u32>) = {
            assert!(portable, "the row tiles on the instructions are x86-64's");
            (
                (rows::tile_f32_portable, rows::multi_f32_portable),
                (rows::tile_bf16_portable, rows::multi_bf16_portable),
                (rows::tile_int8_portable, rows::multi_int8_portable),
            )
        };
        let taps = match products {
            Products::F32 => TapWeights::F32Rows(RowTaps { panels: Panels::f32(weight, ci, co), tile: f32_tiles.0, multi: f32_tiles.1, grouped }),
            Products::Bf16 => TapWeights::Bf16Rows(RowTaps { panels: Panels::bf16(weight, ci, co), tile: bf16_tiles.0, multi: bf16_tiles.1, grouped }),
            Products::Int8 => {
                // Per output channel over all its taps, as `SubmConv3d::quantised`.
                let (scale, q) = int8::quantise_weights(weight, co, TAPS * ci);
                TapWeights::Int8Rows(RowTaps { panels: Panels::int8(&q, &scale, ci, co), tile: int8_tiles.0, multi: int8_tiles.1, grouped })
            }
        };
        Self { ci, co, bias, taps, isa: isa::current() }
    }

    /// As [`SubmConv3d::new`] in bf16 on the AMX tiles by groups of voxels (`tiles.rs`): the
    /// hardware, which the caller has checked this CPU has, or (`emulated`) their emulation.
    pub(crate) fn on_tiles(weight: &[f32], bias: Vec<f32>, ci: usize, co: usize, emulated: bool) -> Self {
        Self::check(weight, &bias, ci, co);
        Self { ci, co, bias, taps: TapWeights::Bf16Tiles(tiles::TileTaps::new(weight, ci, co, emulated)), isa: isa::current() }
    }

    /// As [`SubmConv3d::new`] in int8, for `route` (one this CPU has, or the emulated one).
    pub(crate) fn quantised(weight: &[f32], bias: Vec<f32>, ci: usize, co: usize, route: Route) -> Self {
        Self::check(weight, &bias, ci, co);
        // Per output channel over all its taps, as `moge quantize` stores the weight: an int8
        // checkpoint read back quantises to the very same values.
        let (scale, q) = int8::quantise_weights(weight, co, TAPS * ci);
        let taps = match route {
            Route::Emulated => {
                // q · s_w, as the linears' emulated route dequantises, in the f32 taps' layout.
                let w: Vec<f32> = q.iter().enumerate().map(|(e, &v)| v as f32 * scale[e / (TAPS * ci)]).collect();
                TapWeights::Int8Emulated((0..TAPS).flat_map(|t| tap_kn(&w, ci, co, t)).collect())
            }
            _ => TapWeights::Int8((0..TAPS).map(|t| QuantB::from_quantised(scale.clone(), &tap_nk(&q, ci, co, t), co, ci, route)).collect()),
        };
        Self { ci, co, bias, taps, isa: isa::current() }
    }

    fn check(weight: &[f32], bias: &[f32], ci: usize, co: usize) {
        assert!(weight.len() == co * TAPS * ci && bias.len() == co, "SubmConv3d: weight {} and bias {} for {ci} -> {co}", weight.len(), bias.len());
    }

    pub fn channels(&self) -> (usize, usize) {
        (self.ci, self.co)
    }

    /// Multiply-adds of one call on `nb`.
    pub fn macs(&self, nb: &Neighbours) -> u64 {
        nb.pairs() as u64 * (self.ci * self.co) as u64
    }

    /// y (M × Co) at every voxel of `nb` from x (M × Ci), rows in the voxels' order.
    pub fn forward(&self, x: &[f32], nb: &Neighbours) -> Vec<f32> {
        self.forward_fused(x, nb, Pre::None, None)
    }

    /// y = [residual +] conv(pre(x)): the residual block's LayerNorm and SiLU applied to each
    /// input row in the one pass that prepares the rows for the products (converts, quantises),
    /// and its residual added where the outputs start from the bias (no pass of its own).
    pub fn forward_fused(&self, x: &[f32], nb: &Neighbours, pre: Pre, residual: Option<&[f32]>) -> Vec<f32> {
        let (ci, co, m) = (self.ci, self.co, nb.len());
        assert_eq!(x.len(), m * ci, "SubmConv3d: {} inputs for {m} voxels of {ci} channels", x.len());
        assert!(residual.is_none_or(|r| r.len() == m * co), "SubmConv3d: a residual of {} for {m} voxels of {co} channels", residual.map_or(0, <[f32]>::len));
        if m == 0 {
            return vec![];
        }
        // bf16 rows: the inputs as pair words, made in the one pass; else pre(x) in f32 (x itself
        // where there is nothing to apply).
        // The gathered bf16 taps in panels (the AMX tiles') take pair rows too: each tap gathers
        // converted rows (half the bytes of f32's), and no product converts its A again.
        let words = match &self.taps {
            TapWeights::Bf16Rows(r) => Some(to_pairs(self.isa, x, ci, r.panels.k(), pre)),
            TapWeights::Int8Rows(r) => Some(to_int8(self.isa, x, ci, r.panels.k(), pre)),
            TapWeights::Bf16Tiles(t) => Some(to_pairs(self.isa, x, ci, t.kw(), pre)),
            TapWeights::Bf16(p) => p[0].pair_rows(0).map(|(kps, _)| to_pairs(self.isa, x, ci, kps, pre)),
            _ => None,
        };
        let applied = match (&words, pre) {
            (None, Pre::Norm { .. } | Pre::Silu) => Some(pre.apply(self.isa, x, ci)),
            _ => None,
        };
        let x = applied.as_deref().unwrap_or(x);
        // int8: the inputs quantised once, for the VNNI products or (emulated) back to f32.
        let (quantised, dequantised) = match &self.taps {
            TapWeights::Int8(q) => (Some(quantise_activations(x, m, ci, q[0].route())), None),
            TapWeights::Int8Emulated(_) => (None, Some(fake_quantised(x, m, ci))),
            _ => (None, None),
        };
        let x = dequantised.as_deref().unwrap_or(x);
        // A chunk's outputs in ~512 KiB: each tap's weight is reused over enough rows (a chunk
        // of 32 voxels at 512 channels ran at half the dense rate in f32), and the outputs, one
        // tap's products and its gathered inputs stay within L2 and L3 (`examples/sparse_conv_bench`).
        let chunk = match &self.taps {
            TapWeights::F32Rows(RowTaps { grouped: true, .. })
            | TapWeights::Bf16Rows(RowTaps { grouped: true, .. })
            | TapWeights::Int8Rows(RowTaps { grouped: true, .. }) => rows::GROUP_BLOCK,
            TapWeights::Bf16Tiles(_) => tiles::BLOCK_VOXELS,
            _ => (131_072 / co).clamp(64, 4096),
        };
        // The grouped routes' orders are made here, before the chunks: made inside one (in
        // parallel themselves), the thread making one could take another chunk while it waits,
        // and wait on itself.
        match &self.taps {
            TapWeights::F32Rows(RowTaps { grouped: true, .. })
            | TapWeights::Bf16Rows(RowTaps { grouped: true, .. })
            | TapWeights::Int8Rows(RowTaps { grouped: true, .. }) => _ = nb.by_taps(),
            TapWeights::Bf16Tiles(_) => _ = nb.tile_groups(),
            _ => {}
        }
        // Never zeroed: each chunk starts its rows from the bias (and residual).
        let mut y: Vec<f32> = Vec::with_capacity(m * co);
        y.spare_capacity_mut()[..m * co].par_chunks_mut(chunk * co).enumerate().for_each(|(c, out)| {
            let v0 = c * chunk;
            let n = out.len() / co;
            // The row tiles start every output from the bias and residual themselves.
            match (&self.taps, &words) {
                // SAFETY: a row tile is chosen only where the CPU has it (`new`, `on_rows`).
                (TapWeights::F32Rows(r), _) => return unsafe { r.accumulate(x, out, co, nb, v0, &self.bias, residual) },
                // SAFETY: as above.
                (TapWeights::Bf16Rows(r), Some(words)) => return unsafe { r.accumulate(words, out, co, nb, v0, &self.bias, residual) },
                // SAFETY: as above.
                (TapWeights::Int8Rows(r), Some(words)) => return unsafe { r.accumulate(words, out, co, nb, v0, &self.bias, residual) },
                // SAFETY: `out` is this chunk's rows, and v0 starts a block of the groups (the
                // chunk is `tiles::BLOCK_VOXELS` voxels); the hardware tiles are chosen only
                // where the CPU has them (`new`).
                (TapWeights::Bf16Tiles(t), Some(words)) => return unsafe { t.accumulate(words, out, co, nb, v0, &self.bias, residual) },
                _ => {}
            }
            for (r, o) in out.chunks_exact_mut(co).enumerate() {
                match residual {
                    Some(res) => o.iter_mut().zip(&self.bias).zip(&res[(v0 + r) * co..][..co]).for_each(|((o, b), r)| _ = o.write(b + r)),
                    None => o.iter_mut().zip(&self.bias).for_each(|(o, &b)| _ = o.write(b)),
                }
            }
            // SAFETY: every element of `out` was written just above; f32 and MaybeUninit<f32>
            // have one layout.
            let out = unsafe { &mut *(out as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) };
            // The chunk's rows that have tap t, and their neighbours there.
            let (mut rows, mut srcs): (Vec<u32>, Vec<u32>) = (Vec::with_capacity(n), Vec::with_capacity(n));
            let mut gathered = match (&self.taps, &words) {
                (TapWeights::Int8(q), _) => Gathered::Int8(QuantA::with_rows(n, ci, q[0].route())),
                (TapWeights::Bf16(p), Some(words)) => {
                    let (kps, rows) = p[0].pair_rows(n).expect("pair rows for bf16 taps in panels");
                    Gathered::Pairs(Lines::zeros(rows * kps), kps, words)
                }
                _ => Gathered::F32(vec![0f32; n * ci]),
            };
            // The int8 products' bias: the outputs start from the conv's.
            let zeros = vec![0f32; co];
            let mut products = vec![0f32; n * co];
            for t in 0..TAPS {
                if let (Gathered::Pairs(g, kps, words), TapWeights::Bf16(p), CENTRE) = (&mut gathered, &self.taps, t) {
                    // The chunk's own rows, copied onto cache lines for the tiles' loads.
                    g[..n * *kps].copy_from_slice(&words[v0 * *kps..(v0 + n) * *kps]);
                    g[n * *kps..].fill(0);
                    bf16::gemm_bf16_pairs(g, &p[t], Mat::from_slice_mut(out, n, co, co), true);
                    continue;
                }
                if let (TapWeights::F32(_) | TapWeights::Bf16(_) | TapWeights::Int8Emulated(_), CENTRE) = (&self.taps, t) {
                    self.product(t, &x[v0 * ci..(v0 + n) * ci], n, out, true);
                    continue;
                }
                rows.clear();
                srcs.clear();
                for &(v, s) in nb.pairs_in(t, v0..v0 + n) {
                    rows.push(v - v0 as u32);
                    srcs.push(s);
                }
                let k = rows.len();
                if k == 0 {
                    continue;
                }
                let src = srcs.iter().map(|&s| s as usize);
                match (&mut gathered, &quantised, &self.taps) {
                    (Gathered::Int8(g), Some(a), TapWeights::Int8(q)) => {
                        g.gather(a, src);
                        // SAFETY: products holds k rows of co, this task's own.
                        unsafe { product_quantised(g, &q[t], &zeros, MatMut::from_mut_ptr(products.as_mut_ptr(), k, co, co), false, false) };
                    }
                    (Gathered::Pairs(g, kps, words), _, TapWeights::Bf16(p)) => {
                        let kps = *kps;
                        for (d, s) in g.chunks_exact_mut(kps).zip(src) {
                            d.copy_from_slice(&words[s * kps..(s + 1) * kps]);
                        }
                        // The rows the tiles read past the k gathered: zeros, not another tap's.
                        let padded = p[t].pair_rows(k).map_or(k, |(_, rows)| rows);
                        g[k * kps..padded * kps].fill(0);
                        bf16::gemm_bf16_pairs(g, &p[t], Mat::from_slice_mut(&mut products[..k * co], k, co, co), false);
                    }
                    (Gathered::F32(g), ..) => {
                        for (d, s) in g.chunks_exact_mut(ci).zip(src) {
                            d.copy_from_slice(&x[s * ci..(s + 1) * ci]);
                        }
                        self.product(t, &g[..k * ci], k, &mut products[..k * co], false);
                    }
                    _ => unreachable!("int8 rows for int8 taps"),
                }
                add_rows(self.isa, out, &products[..k * co], &rows, co);
            }
        });
        // SAFETY: the chunks cover all m · co elements, each written by its task.
        unsafe { y.set_len(m * co) };
        y
    }

    /// `dst (n × Co) = [dst +] a (n × Ci) · W_t` on this thread, for the f32 and bf16 taps.
    fn product(&self, t: usize, a: &[f32], n: usize, dst: &mut [f32], accumulate: bool) {
        let (ci, co) = (self.ci, self.co);
        match &self.taps {
            TapWeights::F32(w) | TapWeights::Int8Emulated(w) => {
                let w = &w[t * ci * co..(t + 1) * ci * co];
                // SAFETY: dst holds n rows of co, a n rows of ci, w ci rows of co (sliced above);
                // dst is this task's own.
                unsafe {
                    Gemm::new(n, co, ci).accumulate(accumulate).run(
                        Strided::rows(dst.as_mut_ptr(), co),
                        Strided::rows(a.as_ptr(), ci),
                        Strided::rows(w.as_ptr(), co),
                    )
                }
            }
            TapWeights::Bf16(p) => gemm_bf16(Mat::from_slice(a, n, ci, ci), &p[t], Mat::from_slice_mut(dst, n, co, co), accumulate, 1),
            TapWeights::Int8(_) | TapWeights::F32Rows(_) | TapWeights::Bf16Rows(_) | TapWeights::Int8Rows(_) | TapWeights::Bf16Tiles(_) => {
                unreachable!("int8 taps and row tiles take no products")
            }
        }
    }
}

impl<T: Copy + Default> RowTaps<T> {
    /// One chunk of the outputs (`rows::accumulate` or `rows::accumulate_grouped`).
    ///
    /// # Safety
    /// The tiles run on this CPU.
    #[allow(clippy::too_many_arguments)]
    unsafe fn accumulate(
        &self,
        x: &[T],
        out: &mut [std::mem::MaybeUninit<f32>],
        co: usize,
        nb: &Neighbours,
        v0: usize,
        bias: &[f32],
        residual: Option<&[f32]>,
    ) {
        // SAFETY: the caller's promise, passed on.
        unsafe {
            if self.grouped {
                rows::accumulate_grouped(self.multi, self.tile, &self.panels, x, out, co, nb, v0, bias, residual)
            } else {
                rows::accumulate(self.tile, &self.panels, x, out, co, nb, v0, bias, residual)
            }
        }
    }
}

/// A linear layer in f32 on the row tiles (the refiner's linears between its levels: skinny
/// products, 32-512 channels over up to a voxel per pixel, that the `gemm` crate ran at a third
/// of this), where the CPU has AVX-512.
pub struct DenseRows {
    panels: Panels<f32>,
    bias: Vec<f32>,
    d_out: usize,
    tile: Tile<f32>,
}

impl DenseRows {
    /// From PyTorch's (out, in) weight, where this CPU has the tile (else `None`), or on the
    /// portable twin.
    pub fn new(weight: &[f32], bias: Vec<f32>, d_in: usize, d_out: usize, portable: bool) -> Option<Self> {
        assert!(weight.len() == d_in * d_out && bias.len() == d_out, "linear rows: weight {} and bias {} for {d_in} -> {d_out}", weight.len(), bias.len());
        let tile: Tile<f32> = if portable {
            rows::tile_f32_portable
        } else {
            #[cfg(target_arch = "x86_64")]
            if isa::current() >= Isa::Avx512 {
                avx512::tile_f32
            } else {
                return None;
            }
            #[cfg(not(target_arch = "x86_64"))]
            return None;
        };
        Some(Self { panels: Panels::linear(weight, d_in, d_out), bias, d_out, tile })
    }

    /// y (n × out) = x (n × in) · Wᵀ + b, rows in parallel.
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let (k, co) = (self.panels.k(), self.d_out);
        let n = x.len() / k.max(1);
        assert_eq!(x.len(), n * k, "linear rows: {} inputs of width {k}", x.len());
        let mut y: Vec<f32> = Vec::with_capacity(n * co);
        let rows = 240;
        y.spare_capacity_mut()[..n * co].par_chunks_mut(rows * co).zip(x.par_chunks(rows * k)).for_each(|(out, x)| {
            // SAFETY: the tile was chosen where the CPU has it (`new`).
            unsafe { rows::dense(self.tile, &self.panels, x, out, co, &self.bias) }
        });
        // SAFETY: `dense` wrote every element of each task's rows: all n · co.
        unsafe { y.set_len(n * co) };
        y
    }
}

/// What a convolution applies to each input row before its products ([`SubmConv3d::forward_fused`]).
#[derive(Clone, Copy)]
pub enum Pre<'a> {
    None,
    /// SiLU.
    Silu,
    /// LayerNorm, then SiLU where `silu`.
    Norm {
        norm: &'a LayerNormOp,
        silu: bool,
    },
}

impl Pre<'_> {
    /// `out` = this applied to the row `x`.
    fn row(self, level: Isa, x: &[f32], out: &mut [f32]) {
        match self {
            Pre::None => out.copy_from_slice(x),
            Pre::Silu => {
                out.copy_from_slice(x);
                silu_in_place(level, out);
            }
            Pre::Norm { norm, silu } => {
                // SAFETY: f32 and MaybeUninit<f32> have one layout; the row code only writes.
                let dst = unsafe { &mut *(out as *mut [f32] as *mut [std::mem::MaybeUninit<f32>]) };
                layer_norm_row(norm.isa, x, &norm.weight, &norm.bias, norm.eps, dst);
                if silu {
                    silu_in_place(level, out);
                }
            }
        }
    }

    /// Every row of x (rows of `ci`) with this applied, in parallel.
    fn apply(self, level: Isa, x: &[f32], ci: usize) -> Vec<f32> {
        let mut out = vec![0f32; x.len()];
        let rows = (4096 / ci.max(1)).max(1);
        out.par_chunks_mut(rows * ci).zip(x.par_chunks(rows * ci)).for_each(|(o, x)| {
            for (o, x) in o.chunks_exact_mut(ci).zip(x.chunks_exact(ci)) {
                self.row(level, x, o);
            }
        });
        out
    }
}

/// pre(x) (rows of ci) as rows of `kps` bf16 pair words, in parallel: each block of rows made
/// in a small f32 buffer, then converted (the f32 rows are never stored whole).
fn to_pairs(level: Isa, x: &[f32], ci: usize, kps: usize, pre: Pre) -> Vec<u32> {
    let m = x.len() / ci.max(1);
    let mut words: Vec<u32> = Vec::with_capacity(m * kps);
    let route = if bf16::route(level) >= Isa::Avx512Bf16 { Isa::Avx512Bf16 } else { Isa::Portable };
    let rows = (16_384 / ci.max(1)).clamp(1, 1024);
    words.spare_capacity_mut()[..m * kps].par_chunks_mut(rows * kps).zip(x.par_chunks(rows * ci)).for_each_init(Vec::new, |buf, (d, s)| {
        let n = s.len() / ci;
        if let Pre::None = pre {
            bf16::convert_rows_uninit(route, Mat::from_slice(s, n, ci, ci), kps, d);
        } else {
            buf.resize(s.len(), 0f32);
            for (o, x) in buf.chunks_exact_mut(ci).zip(s.chunks_exact(ci)) {
                pre.row(level, x, o);
            }
            bf16::convert_rows_uninit(route, Mat::from_slice(buf, n, ci, ci), kps, d);
        }
    });
    // SAFETY: the conversion wrote kps words of each of the m rows: all m · kps.
    unsafe { words.set_len(m * kps) };
    words
}

/// pre(x) (rows of ci) as int8 rows of `kw` words (`rows.rs`), in parallel: each row made in a
/// small f32 buffer where there is something to apply, then quantised.
fn to_int8(level: Isa, x: &[f32], ci: usize, kw: usize, pre: Pre) -> Vec<u32> {
    let m = x.len() / ci.max(1);
    let route = int8::route(level);
    let rows = (16_384 / ci.max(1)).clamp(1, 1024);
    let mut words: Vec<u32> = Vec::with_capacity(m * kw);
    words.spare_capacity_mut()[..m * kw].par_chunks_mut(rows * kw).zip(x.par_chunks(rows * ci)).for_each_init(Vec::new, |buf, (d, s)| {
        for (d, x) in d.chunks_exact_mut(kw).zip(s.chunks_exact(ci)) {
            d.fill(std::mem::MaybeUninit::new(0));
            // SAFETY: every word of the row was written just above; u32 and MaybeUninit<u32>
            // have one layout.
            let d = unsafe { &mut *(d as *mut [std::mem::MaybeUninit<u32>] as *mut [u32]) };
            if let Pre::None = pre {
                rows::quantise_int8(route, x, d);
            } else {
                buf.resize(ci, 0f32);
                pre.row(level, x, buf);
                rows::quantise_int8(route, buf, d);
            }
        }
    });
    // SAFETY: each of the m rows' kw words was written.
    unsafe { words.set_len(m * kw) };
    words
}

/// A chunk's gathered inputs of one tap.
enum Gathered<'a> {
    F32(Vec<f32>),
    Int8(QuantA),
    /// bf16 pair rows of `.1` words, on cache lines, gathered from the call's pair rows `.2`.
    Pairs(Lines<u32>, usize, &'a [u32]),
}

/// Tap t's (Ci × Co) block of upstream's weight (Co, 27, Ci): element (i, o) = weight[o][t][i].
fn tap_kn(weight: &[f32], ci: usize, co: usize, t: usize) -> Vec<f32> {
    let mut b = vec![0f32; ci * co];
    for o in 0..co {
        for (i, &v) in weight[(o * TAPS + t) * ci..][..ci].iter().enumerate() {
            b[i * co + o] = v;
        }
    }
    b
}

/// Tap t's (Co × Ci) block, PyTorch's (out, in) of a linear.
fn tap_nk<T: Copy>(weight: &[T], ci: usize, co: usize, t: usize) -> Vec<T> {
    (0..co).flat_map(|o| weight[(o * TAPS + t) * ci..][..ci].iter().copied()).collect()
}

crate::simd::dispatch! {
    /// Row k of `products` (rows of `co`) added into row `rows[k]` of `out`.
    fn add_rows / add_rows_baseline(out: &mut [f32], products: &[f32], rows: &[u32], co: usize) {
        for (p, &r) in products.chunks_exact(co).zip(rows) {
            let o = &mut out[r as usize * co..][..co];
            o.iter_mut().zip(p).for_each(|(o, p)| *o += p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A random voxel set on a small grid, its neighbour map by brute force.
    fn random_voxels(seed: &mut u64, dims: (i32, i32, i32), keep: f32) -> (Vec<[i32; 3]>, Neighbours) {
        let mut rnd = || {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 40) as f32 / (1u64 << 24) as f32
        };
        let mut vox = vec![];
        for i in 0..dims.0 {
            for j in 0..dims.1 {
                for z in 0..dims.2 {
                    if rnd() < keep {
                        vox.push([i, j, z]);
                    }
                }
            }
        }
        let index: std::collections::HashMap<[i32; 3], u32> = vox.iter().enumerate().map(|(v, &p)| (p, v as u32)).collect();
        let mut map = vec![];
        for (v, p) in vox.iter().enumerate() {
            for t in 0..TAPS as i32 {
                let q = [p[0] + t / 9 - 1, p[1] + (t / 3) % 3 - 1, p[2] + t % 3 - 1];
                map.push(index.get(&q).copied().unwrap_or(ABSENT));
            }
            assert_eq!(map[v * TAPS + CENTRE], v as u32);
        }
        (vox, Neighbours::from_map(map))
    }

    /// One voxel per pixel of an h × w map at a depth that steps up every 5 rows and 9 columns:
    /// its neighbour map by brute force.
    fn terraces(h: i32, w: i32) -> Neighbours {
        let z = |i: i32, j: i32| i / 5 + j / 9;
        let mut map = vec![];
        for i in 0..h {
            for j in 0..w {
                for t in 0..TAPS as i32 {
                    let (ni, nj, nz) = (i + t / 9 - 1, j + (t / 3) % 3 - 1, z(i, j) + t % 3 - 1);
                    let inside = (0..h).contains(&ni) && (0..w).contains(&nj) && z(ni, nj) == nz;
                    map.push(if inside { (ni * w + nj) as u32 } else { ABSENT });
                }
            }
        }
        Neighbours::from_map(map)
    }

    /// The dense definition in f64 at the active sites, on operands `round` maps (the identity,
    /// or bf16's rounding): bias + Σ taps Σ ci w · x over the neighbours present.
    fn dense_definition(nb: &Neighbours, x: &[f32], w: &[f32], bias: &[f32], ci: usize, co: usize, round: impl Fn(f32) -> f32) -> Vec<f64> {
        let mut want = vec![0f64; nb.len() * co];
        for v in 0..nb.len() {
            for o in 0..co {
                let mut s = bias[o] as f64;
                for (t, &u) in nb.of(v).iter().enumerate() {
                    if u != ABSENT {
                        let (wr, xr) = (&w[(o * TAPS + t) * ci..][..ci], &x[u as usize * ci..][..ci]);
                        s += wr.iter().zip(xr).map(|(&a, &b)| round(a) as f64 * round(b) as f64).sum::<f64>();
                    }
                }
                want[v * co + o] = s;
            }
        }
        want
    }

    fn max_err(got: &[f32], want: &[f64]) -> f64 {
        assert_eq!(got.len(), want.len());
        got.iter().zip(want).fold(0f64, |a, (&g, &w)| a.max((g as f64 - w).abs()))
    }

    /// The row tiles (their portable twins on every machine, the AVX-512 tiles where the CPU has
    /// them) against the definition on the same rounded (or quantised) operands, on voxel sets
    /// of several chunks (rows of later chunks, pairs across chunk boundaries) and channel
    /// counts off the tiles' 12 rows (int8's passes of 6) and 32 columns and off the pairs of
    /// bf16 and the quads of int8.
    #[test]
    fn row_tiles_match_the_dense_definition() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let level = crate::simd::isa::current();
        let bf16_rounded = crate::model::cpu::matmul::bf16::round_bf16;
        // Random voxels (taps of every kind: few voxels share theirs), and a terraced surface of
        // one voxel per pixel (most share theirs: full groups of the grouped route).
        let cases = [(3, 5, (5, 6, 4), 0.5), (33, 17, (6, 6, 6), 0.6), (32, 64, (48, 40, 4), 0.45), (17, 96, (30, 40, 3), 0.4), (32, 40, (70, 80, 0), 1.0)];
        for (ci, co, dims, keep) in cases {
            let nb = if dims.2 > 0 { random_voxels(&mut seed, dims, keep).1 } else { terraces(dims.0, dims.1) };
            if dims.2 == 0 {
                let order = nb.by_taps();
                let full = order.chunk_by(|a, b| a.0 == b.0).map(|run| run.len() / 12 * 12).sum::<usize>();
                assert!(full * 2 > order.len(), "the terraces: {full} of {} voxels in full groups", order.len());
            }
            let m = nb.len();
            let x = crate::simd::test_values(&mut seed, m * ci);
            let w = crate::simd::test_values(&mut seed, co * TAPS * ci);
            let bias = crate::simd::test_values(&mut seed, co);
            let chunks = m.div_ceil((131_072 / co).clamp(64, 4096));
            let exact = dense_definition(&nb, &x, &w, &bias, ci, co, |v| v);
            let rounded = dense_definition(&nb, &x, &w, &bias, ci, co, bf16_rounded);
            // int8: the same quantised operands, dequantised (inputs per voxel, weights per
            // output channel over its taps).
            let (sw, qw) = int8::quantise_weights(&w, co, TAPS * ci);
            let wq: Vec<f32> = qw.iter().enumerate().map(|(e, &q)| q as f32 * sw[e / (TAPS * ci)]).collect();
            let quantised = dense_definition(&nb, &fake_quantised(&x, m, ci), &wq, &bias, ci, co, |v| v);
            let scale = exact.iter().fold(1f64, |a, v| a.max(v.abs()));
            // (products, portable, runs here): the twins everywhere, the AVX-512 tiles where the
            // CPU has them.
            let x86 = cfg!(target_arch = "x86_64");
            let variants = [
                (Products::F32, true, true),
                (Products::Bf16, true, true),
                (Products::F32, false, x86 && level >= Isa::Avx512),
                (Products::Bf16, false, x86 && crate::model::cpu::matmul::bf16::route(level) >= Isa::Avx512Bf16),
                (Products::Int8, true, true),
                (Products::Int8, false, x86 && int8::route(level) == Route::Avx512Vnni),
            ];
            for (products, portable, _) in variants.into_iter().filter(|v| v.2) {
                for grouped in [false, true] {
                    let conv = SubmConv3d::on_rows_grouped(&w, bias.clone(), ci, co, products, portable, grouped);
                    let got = conv.forward(&x, &nb);
                    let want = match products {
                        Products::F32 => &exact,
                        Products::Bf16 => &rounded,
                        Products::Int8 => &quantised,
                    };
                    let err = max_err(&got, want);
                    assert!(
                        err <= 1e-5 * scale,
                        "{ci}->{co} on {m} voxels in {chunks} chunks ({products:?} rows, portable {portable}, grouped {grouped}): max error {err} of {scale}"
                    );
                }
            }
        }
    }

    /// The AMX tiles by groups of voxels (their emulation on every machine, the hardware where
    /// the CPU has it) against the definition on the same bf16-rounded operands: voxel sets of
    /// several blocks of `by_taps`, groups of mixed taps (random voxels) and of shared ones (the
    /// terraces), channel counts off the tiles' 32 input and 32 output channels, several steps
    /// of input pairs and blocks of outputs.
    #[test]
    fn group_tiles_match_the_dense_definition() {
        let mut seed = 0x51_7cc1_b727_220au64;
        let hardware = bf16::route(isa::current()) == Isa::Amx;
        if !hardware {
            eprintln!("no usable AMX here: the sparse tiles checked on their emulation only");
        }
        let cases = [(3, 5, (5, 6, 4), 0.5), (33, 17, (6, 6, 6), 0.6), (32, 64, (48, 40, 4), 0.45), (70, 96, (30, 40, 3), 0.4), (32, 40, (70, 80, 0), 1.0)];
        for (ci, co, dims, keep) in cases {
            let nb = if dims.2 > 0 { random_voxels(&mut seed, dims, keep).1 } else { terraces(dims.0, dims.1) };
            let m = nb.len();
            let x = crate::simd::test_values(&mut seed, m * ci);
            let w = crate::simd::test_values(&mut seed, co * TAPS * ci);
            let bias = crate::simd::test_values(&mut seed, co);
            let want = dense_definition(&nb, &x, &w, &bias, ci, co, crate::model::cpu::matmul::bf16::round_bf16);
            let scale = want.iter().fold(1f64, |a, v| a.max(v.abs()));
            for emulated in [true, false].into_iter().filter(|&e| e || hardware) {
                let got = SubmConv3d::on_tiles(&w, bias.clone(), ci, co, emulated).forward(&x, &nb);
                let err = max_err(&got, &want);
                assert!(err <= 1e-5 * scale, "{ci}->{co} on {m} voxels (tiles, emulated {emulated}): max error {err} of {scale}");
            }
        }
    }

    /// int8 on AMX builds the bf16 tiles' taps (their bits exactly); elsewhere int8 keeps its
    /// own products (other bits than bf16's).
    #[test]
    fn int8_on_amx_runs_the_bf16_tiles() {
        let mut seed = 0x1357_9bdf_2468_ace0u64;
        let (ci, co) = (40, 48);
        let (_, nb) = random_voxels(&mut seed, (12, 14, 4), 0.5);
        let x = crate::simd::test_values(&mut seed, nb.len() * ci);
        let w = crate::simd::test_values(&mut seed, co * TAPS * ci);
        let bias = crate::simd::test_values(&mut seed, co);
        let run = |p| SubmConv3d::new(&w, bias.clone(), ci, co, p).forward(&x, &nb);
        let (int8, bf16) = (run(Products::Int8), run(Products::Bf16));
        let same = int8.iter().zip(&bf16).all(|(a, b)| a.to_bits() == b.to_bits());
        if bf16::route(isa::current()) == Isa::Amx {
            assert!(same, "int8 on AMX: not the bf16 tiles' bits");
        } else {
            eprintln!("no AMX here: int8 checked to be its own route only");
            assert!(!same, "int8 without AMX: the bf16 route's bits");
        }
    }

    /// `forward_fused` is the residual plus the convolution of the rows with the norm and the
    /// SiLU applied, on every kind of taps (row tiles, gathered products, int8).
    #[test]
    fn fused_prologue_and_residual_match_the_separate_passes() {
        let mut seed = 0x0bad_5eed_1234_5678u64;
        let (ci, co) = (24, 24);
        // More voxels than a chunk holds at 24 channels (4096): the residual of later chunks.
        let (_, nb) = random_voxels(&mut seed, (40, 60, 4), 0.5);
        let m = nb.len();
        let x = crate::simd::test_values(&mut seed, m * ci);
        let w = crate::simd::test_values(&mut seed, co * TAPS * ci);
        let bias = crate::simd::test_values(&mut seed, co);
        let res = crate::simd::test_values(&mut seed, m * co);
        let level = isa::current();
        let norm = LayerNormOp { weight: crate::simd::test_values(&mut seed, ci), bias: crate::simd::test_values(&mut seed, ci), eps: 1e-6, isa: level };
        let normed = norm.run(&x);
        let mut silu_normed = normed.clone();
        silu_in_place(level, &mut silu_normed);
        let mut silu_x = x.clone();
        silu_in_place(level, &mut silu_x);
        let convs = [
            SubmConv3d::on_rows(&w, bias.clone(), ci, co, Products::F32, true),
            SubmConv3d::on_rows(&w, bias.clone(), ci, co, Products::Bf16, true),
            SubmConv3d::on_tiles(&w, bias.clone(), ci, co, true),
            SubmConv3d::packed_by(&w, bias.clone(), ci, co, None),
            SubmConv3d::new(&w, bias.clone(), ci, co, Products::F32),
            SubmConv3d::new(&w, bias.clone(), ci, co, Products::Bf16),
            SubmConv3d::new(&w, bias.clone(), ci, co, Products::Int8),
            SubmConv3d::quantised(&w, bias.clone(), ci, co, Route::Emulated),
        ];
        for (i, conv) in convs.iter().enumerate() {
            for (pre, input, name) in [
                (Pre::Norm { norm: &norm, silu: true }, &silu_normed, "norm+silu"),
                (Pre::Norm { norm: &norm, silu: false }, &normed, "norm"),
                (Pre::Silu, &silu_x, "silu"),
            ] {
                let mut want = conv.forward(input, &nb);
                want.iter_mut().zip(&res).for_each(|(w, r)| *w += r);
                let got = conv.forward_fused(&x, &nb, pre, Some(&res));
                let apart = got.iter().zip(&want).fold(0f32, |a, (g, w)| a.max((g - w).abs()));
                let scale = want.iter().fold(1f32, |a, v| a.max(v.abs()));
                assert!(apart <= 1e-5 * scale, "conv {i}, {name}: fused {apart} from the separate passes (scale {scale})");
            }
            assert_eq!(conv.forward_fused(&x, &nb, Pre::None, None), conv.forward(&x, &nb), "conv {i}: nothing to apply");
        }
    }

    /// The linear on the row tiles (the twin everywhere, AVX-512 where present) against f64, on
    /// row counts off the tiles' 12 and the tasks' 240, widths off the 32 columns.
    #[test]
    fn dense_rows_match_the_definition() {
        let mut seed = 0x7f4a_7c15_9e37_79b9u64;
        for (n, d_in, d_out) in [(1, 3, 32), (13, 32, 64), (500, 64, 33), (241, 7, 1)] {
            let x = crate::simd::test_values(&mut seed, n * d_in);
            let w = crate::simd::test_values(&mut seed, d_out * d_in);
            let bias = crate::simd::test_values(&mut seed, d_out);
            let want: Vec<f64> = (0..n * d_out)
                .map(|e| {
                    let (r, o) = (e / d_out, e % d_out);
                    bias[o] as f64 + (0..d_in).map(|i| x[r * d_in + i] as f64 * w[o * d_in + i] as f64).sum::<f64>()
                })
                .collect();
            for portable in [true, false] {
                let Some(l) = DenseRows::new(&w, bias.clone(), d_in, d_out, portable) else {
                    println!("dense rows: no AVX-512 tile on this CPU, the twin only");
                    continue;
                };
                let err = max_err(&l.forward(&x), &want);
                assert!(err <= 1e-5, "{n} x {d_in} -> {d_out} (portable {portable}): max error {err}");
            }
        }
    }

    /// A range's pairs of a tap are exactly the map's, in order, whatever the range.
    #[test]
    fn pairs_in_a_range_are_the_maps() {
        let mut seed = 0x1357_9bdf_2468_ace0u64;
        let (_, nb) = random_voxels(&mut seed, (9, 8, 5), 0.4);
        let m = nb.len();
        for (a, b) in [(0, m), (0, 0), (m / 3, m / 3 + 7), (m - 1, m), (m / 2, m)] {
            for t in 0..TAPS {
                let want: Vec<(u32, u32)> = (a..b).filter_map(|v| Some(nb.of(v)[t]).filter(|&s| s != ABSENT).map(|s| (v as u32, s))).collect();
                assert_eq!(nb.pairs_in(t, a..b), &want[..], "tap {t}, voxels {a}..{b}");
            }
        }
        assert_eq!(nb.pairs(), nb.map.iter().filter(|&&s| s != ABSENT).count());
    }

    /// The convolution against an f64 evaluation of the dense definition at the active sites,
    /// for channel counts off every tile and chunk boundary, in f32, bf16 and int8.
    #[test]
    fn submanifold_conv_matches_the_dense_definition() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for (ci, co, dims, keep) in [(3, 5, (5, 6, 4), 0.5), (8, 16, (9, 7, 5), 0.35), (33, 17, (6, 6, 6), 0.6), (16, 1030 / 10, (4, 40, 3), 0.8)] {
            let (vox, nb) = random_voxels(&mut seed, dims, keep);
            let m = vox.len();
            let x = crate::simd::test_values(&mut seed, m * ci);
            let w = crate::simd::test_values(&mut seed, co * TAPS * ci);
            let bias = crate::simd::test_values(&mut seed, co);
            let mut want = vec![0f64; m * co];
            for (v, p) in vox.iter().enumerate() {
                for o in 0..co {
                    let mut s = bias[o] as f64;
                    for t in 0..TAPS {
                        let q = [p[0] + t as i32 / 9 - 1, p[1] + (t as i32 / 3) % 3 - 1, p[2] + t as i32 % 3 - 1];
                        if let Some(u) = vox.iter().position(|&o| o == q) {
                            s += (0..ci).map(|i| w[(o * TAPS + t) * ci + i] as f64 * x[u * ci + i] as f64).sum::<f64>();
                        }
                    }
                    want[v * co + o] = s;
                }
            }
            let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
            // f32, then bf16 on every kernel this CPU has, the portable fallback and the AMX
            // tiles' and the multiply-adds' emulations (the hardware's loops, on any machine).
            use crate::model::cpu::matmul::bf16::{route, Kernel};
            let mut kernels: Vec<Option<Kernel>> = crate::simd::isa::levels().map(|l| Kernel::of(route(l))).collect();
            kernels.dedup();
            kernels.push(Some(Kernel::Tiles { emulated: true }));
            kernels.push(Some(Kernel::Mmla { emulated: true }));
            let f32_out = SubmConv3d::new(&w, bias.clone(), ci, co, Products::F32).forward(&x, &nb);
            let err = f32_out.iter().zip(&want).fold(0f64, |a, (&g, &w)| a.max((g as f64 - w).abs()));
            assert!(err <= 1e-5 * scale, "{ci}->{co} on {m} voxels (f32): max error {err} of {scale}");
            for kernel in kernels {
                let pack = move |b: &[f32], k: usize, n: usize| PackedB::build_for(b, k, n, false, kernel);
                let got = SubmConv3d::packed_by(&w, bias.clone(), ci, co, Some(&pack)).forward(&x, &nb);
                let err = got.iter().zip(&want).fold(0f64, |a, (&g, &w)| a.max((g as f64 - w).abs()));
                assert!(err <= 2e-2 * scale, "{ci}->{co} on {m} voxels (bf16, {kernel:?}): max error {err} of {scale}");
            }
            // int8 on every route this CPU has and the emulated one: within 8 bits of the
            // definition, and alike (the same quantised operands; the VNNI sums exact, the
            // emulated ones f32 sums of the dequantised products).
            let mut routes: Vec<Route> = vec![];
            for r in crate::simd::isa::levels().map(|l| int8::route(l).without_tiles()) {
                if !routes.contains(&r) {
                    routes.push(r);
                }
            }
            let emulated = SubmConv3d::quantised(&w, bias.clone(), ci, co, Route::Emulated).forward(&x, &nb);
            for route in routes {
                let got = SubmConv3d::quantised(&w, bias.clone(), ci, co, route).forward(&x, &nb);
                let err = got.iter().zip(&want).fold(0f64, |a, (&g, &w)| a.max((g as f64 - w).abs()));
                assert!(err <= 2e-2 * scale, "{ci}->{co} on {m} voxels (int8, {route:?}): max error {err} of {scale}");
                let apart = got.iter().zip(&emulated).fold(0f32, |a, (&g, &e)| a.max((g - e).abs()));
                assert!(apart as f64 <= 1e-5 * scale * ((TAPS * ci) as f64).sqrt(), "{ci}->{co} (int8, {route:?}): {apart} from the emulated route");
            }
        }
    }

    #[test]
    fn a_map_that_is_not_its_own_centre_is_refused() {
        let mut map = vec![ABSENT; TAPS];
        assert!(std::panic::catch_unwind(|| Neighbours::from_map(map.clone())).is_err());
        map[CENTRE] = 0;
        assert_eq!(Neighbours::from_map(map).pairs(), 1);
    }
}
