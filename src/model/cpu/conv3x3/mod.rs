//! 3x3 convolution with replicate padding (`padding=1, padding_mode='replicate'`), optionally
//! with a ReLU on its input, a 2x bilinear upsample before it, or a residual added after it.
//!
//! Two routes, chosen by [`route`]:
//! * im2col + GEMM (the portable level; bf16 products below AVX512-BF16): each tile of
//!   output rows unfolds only the input rows it needs into a buffer that stays in cache, then
//!   one GEMM per tile writes all output channels. Tiles run in parallel, each GEMM
//!   single-threaded.
//! * Winograd F(2x2, 3x3) (f32 at AVX2 and NEON from 64 channels, AVX-512F from 256;
//!   [`winograd_level`]): [`winograd`]. A
//!   convolution built for upsampled input ([`Conv3x3Op::new_upsampling`]) runs there too, on
//!   the map before its upsample: see [`UpWinograd`].
//! * direct (bf16 products at AVX512-BF16 and on Arm's `bfmmla`, f32 at AVX2 and above and at
//!   NEON): a tile's input rows are copied once into a "slab" (bf16 channel pairs or quads
//!   ([`mmla`]), or f32 channels) with the replicate border in place, and the microkernel
//!   reads every tap straight from the slab at a shifted address, so the 9x unfold (a
//!   memory-bound pass at 64 channels and 600x800 pixels) never happens.
//!   The upsample of the last `Resampler` is computed while the slab is built, so the
//!   upsampled map is never stored.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape};
use std::sync::Arc;

use rayon::prelude::*;

use crate::simd::isa::{self, Isa};
use crate::simd::{Mat, MatMut, SendPtr};

use super::matmul::bf16::{gemm_bf16_packed_a, PackedA};
use super::matmul::gemm::{Gemm, Strided};
use super::matmul::int8::to_u8;
use super::tensor::{contiguous, with_f32};

/// The direct route's instruction set at `level`, or `None` where another runs: im2col at the
/// portable level and for bf16 products below AVX512-BF16 or `bfmmla` (whose GEMM rounds its
/// inputs), the tiles' own direct route for bf16 on AMX ([`tiles`]).
pub fn route(level: Isa, bf16: bool) -> Option<Isa> {
    match (level, bf16) {
        (Isa::Avx512Bf16, true) => Some(Isa::Avx512Bf16),
        (Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx, false) => Some(Isa::Avx512),
        (Isa::Avx2, false) => Some(Isa::Avx2),
        (Isa::Amx | Isa::Avx512 | Isa::Avx2 | Isa::Portable, true) | (Isa::Portable, false) => None,
        // aarch64: f32 on the NEON kernel with nine taps (where the Winograd route does not
        // pay, [`winograd_level`]); bf16 on `bfmmla` ([`mmla`]), or below it through im2col
        // (emulated).
        (Isa::Neon | Isa::Dotprod | Isa::I8mm | Isa::Bf16, false) => Some(Isa::Neon),
        (Isa::Bf16, true) => Some(Isa::Bf16),
        (Isa::Neon | Isa::Dotprod | Isa::I8mm, true) => None,
    }
}

/// Whether f32 convolutions at `level` may take the Winograd route (where
/// [`winograd::Winograd::worth`] says it pays): the levels with a one-tap kernel for its
/// products (`sgemm::Micro`: AVX2, AVX-512F, NEON), never bf16.
pub fn winograd_level(level: Isa, bf16: bool) -> bool {
    !bf16 && crate::simd::sgemm::Micro::at(level).is_some()
}

pub struct Conv3x3Op {
    /// (cout, cin, 3, 3) contiguous: row-major (cout, cin·9), column ci·9 + ky·3 + kx.
    pub weight: candle_core::Tensor,
    pub bias: Vec<f32>,
    pub cin: usize,
    pub cout: usize,
    /// The weight pre-packed for bf16 products (im2col route), when the model runs in bf16 on a
    /// CPU without the direct route.
    pub packed: Option<Arc<PackedA>>,
    /// The weight for the direct route, when this CPU has one.
    direct: Option<Direct>,
    /// The Winograd route (f32 at the AVX2 and NEON levels, 64 channels and more in and out), in
    /// place of the direct one: it takes every call without the upsample.
    winograd: Option<winograd::Winograd>,
    /// The upsampled calls' Winograd route, where the op was built for them.
    up: Option<UpWinograd>,
    /// bf16 on AMX tiles, direct ([`tiles::TileConv`]), in place of im2col.
    tiles: Option<tiles::TileConv>,
    /// The upsampled calls' tile route, where the op was built for them on AMX.
    up_tiles: Option<UpTiles>,
}

/// conv3x3(upsample_bilinear_2x(x)) on AMX tiles as [`UpWinograd`] does it: one tile
/// convolution of x to the four phases' 4·cout channels, whose epilogue interleaves them
/// ([`tiles::TileConv::new_upsampling`]). Before, candle upsampled the map on one thread (0.5 s
/// of a 3 s ViT-L forward in bf16) and the tiles then converted the 4x larger map to bf16.
struct UpTiles {
    conv: tiles::TileConv,
}

/// conv3x3(upsample_bilinear_2x(x)) as one Winograd convolution of x itself, to 4·cout
/// channels, then a pixel shuffle. Output pixel (2i + py, 2j + px) reads upsampled rows and
/// columns that are each a blend of x's at offsets -1, 0, +1 from (i, j) (weights ¼ and ¾), so
/// it is a 3x3 convolution of x with a kernel of its own per phase (py, px): the four phases
/// are the four groups of output channels. With replicate padding on both sides this holds at
/// the borders too: the upsample's clamp and the convolution's padding both repeat the edge
/// row, which a ¼ / ¾ blend of a repeated row leaves as it is. The upsampled map (4x the
/// input) is never made, and the products run on the Winograd route (64 channels and more in,
/// 16 and more out) instead of the direct one.
struct UpWinograd {
    wg: winograd::Winograd,
    /// The bias once per phase.
    bias4: Vec<f32>,
}

/// Rows of the phase matrices: upsampled tap k (offset k - 1) of output phase p, as weights on
/// x at offsets -1, 0, +1 (row d): output 2i + p reads upsampled rows 2i + p - 1 + k, and
/// upsampled row 2m is ¼ x[m - 1] + ¾ x[m], row 2m + 1 is ¾ x[m] + ¼ x[m + 1].
const PHASE: [[[f64; 3]; 3]; 2] = [
    // p = 0: rows 2i - 1, 2i, 2i + 1.
    [[0.75, 0.25, 0.0], [0.25, 0.75, 0.75], [0.0, 0.0, 0.25]],
    // p = 1: rows 2i, 2i + 1, 2i + 2.
    [[0.25, 0.0, 0.0], [0.75, 0.75, 0.25], [0.0, 0.25, 0.75]],
];

impl UpWinograd {
    /// From a (cout, cin, 3, 3) weight of the convolution after the upsample; `None` where the
    /// Winograd route does not pay or is not this level's.
    fn new(w: &[f32], bias: &[f32], cin: usize, cout: usize) -> Option<Self> {
        if !winograd::Winograd::worth(isa::current(), cin, 4 * cout) {
            return None;
        }
        let wg = winograd::Winograd::new(&phased_weights(w, cin, cout), cin, 4 * cout)?;
        Some(Self { wg, bias4: bias.repeat(4) })
    }

    /// out (cout, 2h, 2w) from x (cin, h, w) [+ residual].
    fn run(&self, x: &[f32], h: usize, w: usize, cout: usize, residual: Option<&[f32]>) -> Vec<f32> {
        interleave_phases(&self.wg.run(x, h, w, false, &self.bias4, None), h, w, cout, residual)
    }
}

/// The four phases' kernels ([`UpWinograd`]) of a (cout, cin, 3, 3) weight of the convolution
/// after a 2x bilinear upsample: (4·cout, cin, 3, 3), output channel (py·2 + px)·cout + o.
pub(crate) fn phased_weights(w: &[f32], cin: usize, cout: usize) -> Vec<f32> {
    let mut phased = vec![0f32; 4 * cout * cin * 9];
    for (ph, [py, px]) in [[0, 0], [0, 1], [1, 0], [1, 1]].into_iter().enumerate() {
        let (ay, ax) = (&PHASE[py], &PHASE[px]);
        for o in 0..cout {
            for c in 0..cin {
                let g = &w[(o * cin + c) * 9..][..9];
                let dst = &mut phased[((ph * cout + o) * cin + c) * 9..][..9];
                for dy in 0..3 {
                    for dx in 0..3 {
                        let mut v = 0f64;
                        for ky in 0..3 {
                            for kx in 0..3 {
                                v += ay[dy][ky] * ax[dx][kx] * g[ky * 3 + kx] as f64;
                            }
                        }
                        dst[dy * 3 + dx] = v as f32;
                    }
                }
            }
        }
    }
    phased
}

/// The (cout, 2h, 2w) output [+ residual] from the four phases' (4·cout, h, w) outputs of
/// [`phased_weights`]' convolution.
pub(crate) fn interleave_phases(y: &[f32], h: usize, w: usize, cout: usize, residual: Option<&[f32]>) -> Vec<f32> {
    let (oh, ow) = (2 * h, 2 * w);
    // Not zeroed: every row is written below, on both threads.
    let mut out: Vec<f32> = Vec::with_capacity(cout * oh * ow);
    if cout * oh * ow == 0 {
        return out;
    }
    let ptr = SendPtr(out.as_mut_ptr());
    (0..cout * oh).into_par_iter().for_each(|row| {
        // SAFETY: row `row` of the capacity's cout · oh rows of ow floats, this task's alone,
        // written whole (w pairs) before anything reads it.
        let dst = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(row * ow), ow) };
        let (o, oy) = (row / oh, row % oh);
        let (i, py) = (oy / 2, oy % 2);
        // Phases (py, 0) and (py, 1) of this row, interleaved.
        let even = &y[(((2 * py) * cout + o) * h + i) * w..][..w];
        let odd = &y[(((2 * py + 1) * cout + o) * h + i) * w..][..w];
        for ((d, &a), &b) in dst.chunks_exact_mut(2).zip(even).zip(odd) {
            d[0] = a;
            d[1] = b;
        }
        if let Some(r) = residual {
            dst.iter_mut().zip(&r[row * ow..][..ow]).for_each(|(d, &r)| *d += r);
        }
    });
    // SAFETY: all cout · oh rows were written above.
    unsafe { out.set_len(cout * oh * ow) };
    out
}

/// Direct-route weights: row o holds the 9 taps one after another, each over the input
/// channels: in bf16, word t·cinp + cp is channels (2cp, 2cp + 1) as a bf16 pair; in f32, word
/// t·cin + c is channel c's f32 bits. On the AVX2 and NEON routes the rows of each of their
/// row tiles are interleaved instead (`sgemm::packed_index`), so the kernel reads its weights
/// in one stream; on `bfmmla` ([`mmla`]) row pairs' quads are.
struct Direct {
    words: Vec<u32>,
    bf16: bool,
    /// The route ([`route`]): the slab and the kernel take it, never asking again.
    isa: Isa,
    /// On the `bfmmla` route, its portable twin's tile instead (`mmla::kernel_emulated`: the
    /// tests of machines without the instruction).
    emulated: bool,
}

/// Words per tap, per output channel (and per slab pixel) on route `isa`: channel pairs in bf16
/// (whole quads of channels on `bfmmla`).
fn words_per_tap(cin: usize, bf16: bool, isa: Isa) -> usize {
    match (bf16, isa) {
        (true, Isa::Bf16) => mmla::words_per_pixel(cin),
        (true, _) => cin.div_ceil(2),
        (false, _) => cin,
    }
}

/// Target size of one tile's unfolded input, in floats (~1 MiB: L2-resident).
const TILE_FLOATS: usize = 256 * 1024;
/// Target size of one tile's slab, in words (~512 KiB): it stays in L2 while every tap and
/// every block of output channels reads it.
const SLAB_WORDS: usize = 128 * 1024;
/// Bytes of direct weights per output-channel block, beside the slab in L2.
const A_BLOCK_BYTES: usize = 256 * 1024;

impl Conv3x3Op {
    /// `bf16`: products in bf16 (weights packed once here). The route is that of
    /// [`isa::current`] now.
    pub fn new(weight: candle_core::Tensor, bias: Vec<f32>, cin: usize, cout: usize, bf16: bool) -> Result<Self> {
        Self::build(weight, bias, cin, cout, bf16, true, false)
    }

    /// [`Conv3x3Op::new`] without the Winograd route: the direct route takes every call where
    /// it exists (to compare the two).
    pub fn new_direct(weight: candle_core::Tensor, bias: Vec<f32>, cin: usize, cout: usize, bf16: bool) -> Result<Self> {
        Self::build(weight, bias, cin, cout, bf16, false, false)
    }

    /// [`Conv3x3Op::new`] for a convolution of upsampled input (`Resampler`'s bilinear): its
    /// upsampled calls take the Winograd route ([`UpWinograd`]) where it pays.
    pub fn new_upsampling(weight: candle_core::Tensor, bias: Vec<f32>, cin: usize, cout: usize, bf16: bool) -> Result<Self> {
        Self::build(weight, bias, cin, cout, bf16, true, true)
    }

    fn build(weight: candle_core::Tensor, bias: Vec<f32>, cin: usize, cout: usize, bf16: bool, winograd: bool, upsampling: bool) -> Result<Self> {
        let level = isa::current();
        let winograd = winograd && winograd_level(level, bf16);
        let up = if upsampling && winograd { with_f32(&weight, |w| UpWinograd::new(w, &bias, cin, cout))? } else { None };
        // An op whose upsampled calls have their own route is only called upsampled
        // (`Resampler`): the other routes' weights are not made for it (a plain call would take
        // the im2col route).
        let winograd = if up.is_none() && winograd && winograd::Winograd::worth(level, cin, cout) {
            with_f32(&weight, |w| winograd::Winograd::new(w, cin, cout))?
        } else {
            None
        };
        // Not packed beside the Winograd route (its weights are 16/9 the size already): an
        // upsampling call there is upsampled first by the caller (`fuses_upsample` is false).
        let direct = match route(level, bf16) {
            Some(isa) if winograd.is_none() && up.is_none() => Some(with_f32(&weight, |w| pack_direct(w, cin, cout, bf16, isa))?),
            _ => None,
        };
        // bf16 on AMX: the direct tile route; elsewhere without a direct route, im2col's packed
        // weight.
        // An upsampling op's calls are all upsampled: its phases' weights alone.
        let amx = bf16 && level == Isa::Amx;
        let up_tiles = if amx && upsampling {
            Some(with_f32(&weight, |w| UpTiles { conv: tiles::TileConv::new_upsampling(w, cin, cout, tiles::Kind::Bf16, false) })?)
        } else {
            None
        };
        let tiles = if amx && up_tiles.is_none() { Some(with_f32(&weight, |w| tiles::TileConv::new(w, cin, cout, tiles::Kind::Bf16, false))?) } else { None };
        let packed = if bf16 && direct.is_none() && tiles.is_none() && up_tiles.is_none() {
            Some(Arc::new(with_f32(&weight, |w| PackedA::build(w, cout, cin * 9, level))?))
        } else {
            None
        };
        Ok(Self { weight, bias, cin, cout, packed, direct, winograd, up, tiles, up_tiles })
    }

    /// Whether calls without the fused upsample take the Winograd route.
    pub fn winograd(&self) -> bool {
        self.winograd.is_some()
    }

    /// Whether [`Conv3x3Call::upsample2x`] is available (the direct route exists, or the
    /// upsampled calls' Winograd route).
    pub fn fuses_upsample(&self) -> bool {
        self.direct.is_some() || self.up.is_some() || self.up_tiles.is_some()
    }

    /// Whether upsampled calls take the Winograd route ([`Conv3x3Op::new_upsampling`]).
    pub fn upsampled_winograd(&self) -> bool {
        self.up.is_some()
    }

    pub fn call(&self, relu_input: bool, upsample2x: bool) -> Conv3x3Call<'_> {
        Conv3x3Call { op: self, relu_input, upsample2x }
    }

    /// out (cout, h, w) from x (cin, h, w) [+ residual], without the upsample.
    pub(crate) fn run_f32(&self, x: &[f32], h: usize, w: usize, relu: bool, residual: Option<&[f32]>) -> Result<Vec<f32>> {
        self.run(x, h, w, relu, false, residual)
    }

    /// `x` is (cin, h, w), or (cin, h/2, w/2) with `upsample2x`; output (cout, h, w).
    fn run(&self, x: &[f32], h: usize, w: usize, relu: bool, upsample2x: bool, residual: Option<&[f32]>) -> Result<Vec<f32>> {
        if let (Some(wg), false) = (&self.winograd, upsample2x) {
            return Ok(wg.run(x, h, w, relu, &self.bias, residual));
        }
        if let (Some(up), true) = (&self.up, upsample2x) {
            return Ok(up.run(x, h / 2, w / 2, self.cout, residual));
        }
        if let (Some(up), true) = (&self.up_tiles, upsample2x) {
            let (h2, w2) = (h / 2, w / 2);
            return Ok(up.conv.run_upsampled(x, (h2, w2), &self.bias, residual));
        }
        // (With the Winograd route, `direct` is None: an upsampling call fails below.)
        if let Some(d) = &self.direct {
            // Taken at every width: even at 49 px (two panels, one mostly idle) it measured as
            // fast as im2col (PERFORMANCE.md step 8).
            let src = if upsample2x { Src::Up2 { x, h: h / 2, w: w / 2 } } else { Src::Plain { x, relu } };
            return Ok(self.run_direct(d, src, h, w, residual));
        }
        if upsample2x {
            candle_core::bail!("conv3x3: the fused upsample needs the direct route");
        }
        if let Some(t) = &self.tiles {
            return Ok(t.run(x, (h, w), relu, &self.bias, residual));
        }
        with_f32(&self.weight, |wt| self.run_im2col(x, wt, h, w, relu, residual))
    }

    fn run_im2col(&self, x: &[f32], weight: &[f32], h: usize, w: usize, relu: bool, residual: Option<&[f32]>) -> Vec<f32> {
        let (cin, cout) = (self.cin, self.cout);
        let k = cin * 9;
        let hw = h * w;
        assert!(weight.len() >= cout * k, "conv3x3: a weight of {} for {cout} x {k}", weight.len());
        let mut out = vec![0f32; cout * hw];
        let rows_per_tile = (TILE_FLOATS / (k * w).max(1)).clamp(1, h);
        let tiles: Vec<(usize, usize)> = (0..h).step_by(rows_per_tile).map(|y0| (y0, (y0 + rows_per_tile).min(h))).collect();
        let out_ptr = SendPtr(out.as_mut_ptr());
        tiles.par_iter().for_each_init(Vec::new, |cols: &mut Vec<f32>, &(y0, y1)| {
            let n = (y1 - y0) * w;
            cols.resize(k * n, 0.0);
            for ci in 0..cin {
                let plane = &x[ci * hw..(ci + 1) * hw];
                for ky in 0..3 {
                    for kx in 0..3 {
                        let dst = &mut cols[(ci * 9 + ky * 3 + kx) * n..(ci * 9 + ky * 3 + kx + 1) * n];
                        for (ty, y) in (y0..y1).enumerate() {
                            let sy = (y + ky).saturating_sub(1).min(h - 1);
                            let src = &plane[sy * w..(sy + 1) * w];
                            let d = &mut dst[ty * w..(ty + 1) * w];
                            // Column shift by kx-1 with the edge pixel replicated.
                            match kx {
                                0 => {
                                    d[0] = src[0];
                                    d[1..].copy_from_slice(&src[..w - 1]);
                                }
                                1 => d.copy_from_slice(src),
                                _ => {
                                    d[..w - 1].copy_from_slice(&src[1..]);
                                    d[w - 1] = src[w - 1];
                                }
                            }
                            if relu {
                                d.iter_mut().for_each(|v| *v = v.max(0.0));
                            }
                        }
                    }
                }
            }
            // out[:, y0·w .. y1·w] = bias [+ residual] + W · cols: this tile's columns of every
            // output channel's plane, which no other tile writes.
            let dst = Mat::from_mut_ptr(out_ptr.get(), cout, hw, hw).block(0, y0 * w, cout, n);
            let start = |o: usize, r: &mut [f32]| match residual {
                Some(res) => r.iter_mut().zip(&res[o * hw + y0 * w..][..n]).for_each(|(v, &a)| *v = a + self.bias[o]),
                None => r.fill(self.bias[o]),
            };
            if let Some(packed) = &self.packed {
                // bf16 products into a tile-local buffer, then copied to this tile's columns.
                let mut tile = vec![0f32; cout * n];
                for (o, r) in tile.chunks_exact_mut(n).enumerate() {
                    start(o, r);
                }
                gemm_bf16_packed_a(packed, Mat::from_slice(cols, k, n, n), Mat::from_slice_mut(&mut tile, cout, n, n), true, 1);
                for (o, r) in tile.chunks_exact(n).enumerate() {
                    // SAFETY: row o of `dst` is n floats of `out` (cout · hw of them), this
                    // tile's alone; `tile` is another buffer.
                    unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), dst.row(o), n) };
                }
                return;
            }
            for o in 0..cout {
                // SAFETY: as above: row o of `dst`, this tile's alone.
                start(o, unsafe { std::slice::from_raw_parts_mut(dst.row(o), n) });
            }
            // SAFETY: `dst` is cout rows of n floats of `out`, hw apart, this tile's alone;
            // `weight` holds cout rows of k (the op's (cout, cin, 3, 3) tensor, asserted) and
            // `cols` k rows of n.
            unsafe {
                Gemm::new(cout, n, k).accumulate(true).run(Strided::rows(dst.ptr(), hw), Strided::rows(weight.as_ptr(), k), Strided::rows(cols.as_ptr(), n));
            }
        });
        out
    }

    /// The direct route: output (cout, h, w) from `src`, in tiles of rows, in parallel.
    fn run_direct(&self, d: &Direct, src: Src, h: usize, w: usize, residual: Option<&[f32]>) -> Vec<f32> {
        let plan = Plan { cin: self.cin, cout: self.cout, h, w, kc: words_per_tap(self.cin, d.bf16, d.isa) };
        let (cout, kc, wp, hw) = (plan.cout, plan.kc, w + 2, h * w);
        // `bfmmla`'s tiles read whole row pairs: an odd cout's padding row too.
        let rows_packed = if d.isa == Isa::Bf16 { cout.div_ceil(2) * 2 } else { cout };
        assert!(d.words.len() >= rows_packed * 9 * kc && self.bias.len() >= cout, "conv3x3: weights for {cout} channels");
        let residual = residual.map(|r| Mat::from_slice(r, cout, hw, hw));
        let rows = (SLAB_WORDS / (kc * wp)).saturating_sub(2).clamp(1, h);
        let tiles: Vec<(usize, usize)> = (0..h).step_by(rows).map(|y0| (y0, (y0 + rows).min(h))).collect();
        let mut out: Vec<f32> = Vec::with_capacity(cout * hw);
        let out_ptr = SendPtr(out.as_mut_ptr());
        tiles.par_iter().for_each_init(
            || (Vec::new(), Vec::new()),
            |(slab, tmp): &mut (Vec<u32>, Vec<f32>), &(y0, y1)| {
                let rows_in = y1 - y0 + 2;
                slab.resize(rows_in * kc * wp + 32, 0);
                d.build_slab(src, plan, y0, rows_in, slab, tmp);
                let out = Mat::from_mut_ptr(out_ptr.get(), cout, hw, hw);
                // SAFETY: `out` has room for cout · hw floats; tiles write disjoint row ranges
                // of its planes (y0..y1 this one), and every (o, y, x) of the tile is written by
                // exactly one kernel call. The slab was just built for this tile.
                unsafe { direct_tile(d, plan, slab, &self.bias, (y0, y1), out, residual) };
            },
        );
        // SAFETY: every element was written above, within the capacity.
        unsafe { out.set_len(cout * hw) };
        out
    }
}

/// Weights (cout, cin, 3, 3) in the direct kernel's order (see [`Direct`]), for route `isa`.
fn pack_direct(w: &[f32], cin: usize, cout: usize, bf16: bool, isa: Isa) -> Direct {
    let at = |o: usize, c: usize, t: usize| if c < cin { w[(o * cin + c) * 9 + t] } else { 0.0 };
    if bf16 && isa == Isa::Bf16 {
        return Direct { words: mmla::pack(w, cin, cout), bf16, isa, emulated: false };
    }
    let kc = words_per_tap(cin, bf16, isa);
    let mut words = vec![0u32; cout * 9 * kc];
    if let Some(micro) = six_rows(isa) {
        // In the 6-row kernel's row tiles, each tile's weights interleaved (`packed_index`).
        let b = micro.row_tiles(cout);
        for tile in b.windows(2) {
            let (o0, rows) = (tile[0], tile[1] - tile[0]);
            let block = &mut words[o0 * 9 * kc..][..rows * 9 * kc];
            for r in 0..rows {
                for t in 0..9 {
                    for k in 0..kc {
                        block[crate::simd::sgemm::packed_index(rows, kc, r, t, k)] = at(o0 + r, k, t).to_bits();
                    }
                }
            }
        }
        return Direct { words, bf16, isa, emulated: false };
    }
    for o in 0..cout {
        for t in 0..9 {
            for k in 0..kc {
                words[(o * 9 + t) * kc + k] = if bf16 { super::matmul::bf16::pair(at(o, 2 * k, t), at(o, 2 * k + 1, t)) } else { at(o, k, t).to_bits() };
            }
        }
    }
    Direct { words, bf16, isa, emulated: false }
}

/// Where a slab's values come from.
#[derive(Clone, Copy)]
enum Src<'a> {
    /// The input map itself, (cin, h, w), optionally through a ReLU.
    Plain { x: &'a [f32], relu: bool },
    /// `F.interpolate(x, scale_factor=2, mode='bilinear', align_corners=False)` of a
    /// (cin, h, w) map: the output map is (2h, 2w).
    Up2 { x: &'a [f32], h: usize, w: usize },
}

/// One direct-route call's shape: the output map (cout, h, w) from `cin` channels, and `kc`
/// words per pixel of a slab row (its channels, or channel pairs in bf16, padded to whole
/// quads on `bfmmla`).
#[derive(Clone, Copy)]
struct Plan {
    cin: usize,
    cout: usize,
    h: usize,
    w: usize,
    kc: usize,
}

impl Direct {
    /// Fill `slab` for output rows [y0, y0 + rows_in - 2): slab row r is map row y0 + r − 1
    /// (clamped: replicate padding), laid out (r, channel pair or channel, x + 1) with the border
    /// columns replicated, so tap (ky, kx) of output pixel (y, x) is at row y − y0 + ky, column
    /// x + kx. Words are bf16 pairs in bf16, else f32 bits, on this route. On `bfmmla` the layout
    /// is (r, channel quad, x + 1, two pair words) ([`mmla`]): a pixel is two words.
    fn build_slab(&self, src: Src, plan: Plan, y0: usize, rows_in: usize, slab: &mut [u32], tmp: &mut Vec<f32>) {
        let Plan { cin, h, w, .. } = plan;
        let (bf16, isa) = (self.bf16, self.isa);
        let wp = w + 2;
        if !bf16 {
            let slab: &mut [f32] = bytemuck::cast_slice_mut(slab);
            tmp.resize(w, 0.0);
            for r in 0..rows_in {
                let sy = (y0 + r).saturating_sub(1).min(h - 1);
                for c in 0..cin {
                    let dst = &mut slab[(r * cin + c) * wp..][..wp];
                    match src {
                        Src::Plain { x, relu } => {
                            let row = &x[(c * h + sy) * w..][..w];
                            if relu {
                                dst[1..=w].iter_mut().zip(row).for_each(|(d, &v)| *d = v.max(0.0));
                            } else {
                                dst[1..=w].copy_from_slice(row);
                            }
                        }
                        Src::Up2 { x, h: lh, w: lw } => upsample_row(isa, &x[c * lh * lw..][..lh * lw], lh, lw, sy, &mut dst[1..=w], &mut tmp[..lw]),
                    }
                    dst[0] = dst[1];
                    dst[w + 1] = dst[w];
                }
            }
            return;
        }
        let mmla = isa == Isa::Bf16;
        // Pair rows per slab row: cin's pairs, padded to whole quads on `bfmmla`.
        let cinp = plan.kc;
        // tmp: two upsampled rows, a vertical blend row and a zero row (odd cin).
        tmp.resize(4 * w, 0.0);
        let (rows2, rest) = tmp.split_at_mut(2 * w);
        let (vrow, zero) = rest.split_at_mut(w);
        zero.fill(0.0);
        // On `bfmmla`, a quad's two pair rows before they are interleaved into the slab.
        let mut quad = vec![0u32; if mmla { 2 * wp } else { 0 }];
        for r in 0..rows_in {
            let sy = (y0 + r).saturating_sub(1).min(h - 1);
            for cp in 0..cinp {
                let dst = if mmla { &mut quad[(cp % 2) * wp..][..wp] } else { &mut slab[(r * cinp + cp) * wp..][..wp] };
                let (c0, c1) = (2 * cp, 2 * cp + 1);
                if c0 >= cin {
                    // A quad's padding.
                    dst.fill(0);
                } else {
                    match src {
                        Src::Plain { x, relu } => {
                            let a = &x[(c0 * h + sy) * w..][..w];
                            let b = if c1 < cin { &x[(c1 * h + sy) * w..][..w] } else { &*zero };
                            pairs(isa, a, b, relu, &mut dst[1..=w]);
                        }
                        Src::Up2 { x, h: lh, w: lw } => {
                            let (ra, rb) = rows2.split_at_mut(w);
                            upsample_row(isa, &x[c0 * lh * lw..][..lh * lw], lh, lw, sy, ra, &mut vrow[..lw]);
                            if c1 < cin {
                                upsample_row(isa, &x[c1 * lh * lw..][..lh * lw], lh, lw, sy, rb, &mut vrow[..lw]);
                            } else {
                                rb.fill(0.0);
                            }
                            pairs(isa, ra, rb, false, &mut dst[1..=w]);
                        }
                    }
                    dst[0] = dst[1];
                    dst[w + 1] = dst[w];
                }
                if mmla && cp % 2 == 1 {
                    let (lo, hi) = quad.split_at(wp);
                    mmla::interleave(lo, hi, &mut slab[(r * cinp + cp - 1) * wp..][..2 * wp]);
                }
            }
        }
    }
}

crate::simd::dispatch! {
    /// Row `sy` of the 2x bilinear upsample (align_corners=False) of an (h, w) plane into `out`
    /// (2w). At exactly 2x the weights are 1/4 and 3/4, with the edge rows/columns clamped.
    /// Compiled per level: at the baseline's SSE2 it took 11 % of an int8 ViT-S image on an Intel
    /// Xeon (`perf`), where it builds the slabs of the last resampler's convolution.
    fn upsample_row / upsample_row_base(plane: &[f32], h: usize, w: usize, sy: usize, out: &mut [f32], v: &mut [f32]) {
        let i = sy / 2;
        let (i0, i1, a0, a1) = if sy.is_multiple_of(2) { (i.saturating_sub(1), i, 0.25f32, 0.75f32) } else { (i, (i + 1).min(h - 1), 0.75, 0.25) };
        let (r0, r1) = (&plane[i0 * w..][..w], &plane[i1 * w..][..w]);
        let v = &mut v[..w];
        for ((v, &p), &q) in v.iter_mut().zip(r0).zip(r1) {
            *v = a0 * p + a1 * q;
        }
        let out = &mut out[..2 * w];
        out[0] = v[0];
        out[2 * w - 1] = v[w - 1];
        // Output columns 2j + 1 and 2j + 2 lie between inputs j and j + 1.
        for j in 0..w - 1 {
            let (a, b) = (v[j], v[j + 1]);
            out[2 * j + 1] = 0.75 * a + 0.25 * b;
            out[2 * j + 2] = 0.25 * a + 0.75 * b;
        }
    }
}

/// dst[i] = bf16(a[i]) | bf16(b[i]) << 16 (after a ReLU when asked), on route `isa` (a
/// [`route`] or [`super::matmul::bf16::route`]: AVX512-BF16 only where the CPU has it).
fn pairs(isa: Isa, a: &[f32], b: &[f32], relu: bool, dst: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512Bf16 {
        // SAFETY: these routes are AVX512-BF16 (AMX: with it) only where the CPU has it.
        unsafe { avx512::pairs(a, b, relu, dst) };
        return;
    }
    let _ = isa;
    let f = |v: f32| if relu { v.max(0.0) } else { v };
    for ((d, &p), &q) in dst.iter_mut().zip(a).zip(b) {
        *d = super::matmul::bf16::pair(f(p), f(q));
    }
}

/// A row of pairs P(c) = [`pairs`] of (a[c], b[c]), c < w = a.len(), as three copies of `n`
/// words each (the tile route's slab: one per horizontal tap): `dst[kx][c]` = P(clamp(c + kx −
/// 1, 0, w − 1)) for c < w, 0 for w ≤ c < n.
fn pairs3(isa: Isa, a: &[f32], b: &[f32], relu: bool, dst: [&mut [u32]; 3]) {
    let w = a.len();
    assert!(b.len() == w && w > 0 && dst.iter().all(|d| d.len() >= w), "pairs3: shapes");
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512Bf16 {
        // SAFETY: these routes are AVX512-BF16 (AMX: with it) only where the CPU has it.
        unsafe { avx512::pairs3(a, b, relu, dst) };
        return;
    }
    let _ = isa;
    let f = |v: f32| if relu { v.max(0.0) } else { v };
    copies3(w, dst, |c| super::matmul::bf16::pair(f(a[c]), f(b[c])));
}

/// The u8 of v (after a ReLU when asked) for an int8 slab: [`to_u8`] with the band's inverse
/// scale and zero point.
fn quantised(v: f32, relu: bool, inv: f32, zero: i32) -> u8 {
    to_u8(if relu { v.max(0.0) } else { v }, inv, zero as f32) as u8
}

/// [`pairs3`] for the int8 slab: the words Q(c) of the four channels' u8 at column c (channel
/// j's in byte j, [`quantised`]), three copies shifted.
fn quads3(isa: Isa, rows: [&[f32]; 4], relu: bool, (inv, zero): (f32, i32), dst: [&mut [u32]; 3]) {
    let w = rows[0].len();
    assert!(rows.iter().all(|r| r.len() == w) && w > 0 && dst.iter().all(|d| d.len() >= w), "quads3: shapes");
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512Bf16 {
        // SAFETY: the level (AVX-512 with BW and VL) is given only where the CPU has it.
        unsafe { avx512::quads3(rows, relu, inv, zero, dst) };
        return;
    }
    let _ = isa;
    copies3(w, dst, |c| u32::from_le_bytes(rows.map(|r| quantised(r[c], relu, inv, zero))));
}

/// `dst[kx][c]` = word(clamp(c + kx − 1, 0, w − 1)) for c < w, 0 for w ≤ c (the portable
/// [`pairs3`] and [`quads3`]).
fn copies3(w: usize, dst: [&mut [u32]; 3], word: impl Fn(usize) -> u32) {
    for (kx, d) in dst.into_iter().enumerate() {
        for (c, v) in d.iter_mut().enumerate() {
            *v = if c < w { word((c + kx).saturating_sub(1).min(w - 1)) } else { 0 };
        }
    }
}

/// All output pixels of rows [y0, y1) from the tile's slab into `out` (cout rows, the output
/// channels' planes of h·w) [+ `residual`, the same shape].
///
/// # Safety
/// `d` and `plan` are this op's, every element of `out` is writable, and `slab` was built for
/// this tile by [`Direct::build_slab`].
unsafe fn direct_tile(d: &Direct, plan: Plan, slab: &[u32], bias: &[f32], (y0, y1): (usize, usize), out: MatMut<f32>, residual: Option<Mat<&[f32]>>) {
    use super::matmul::bf16::MR;
    use crate::simd::mat::Prefetch;
    let Plan { cout, w, kc, .. } = plan;
    let kp = 9 * kc;
    let wp = w + 2;
    // Output channels in blocks whose weights stay in L2 beside the slab, each block cut into
    // row panels: the tiles their weights were packed in on AVX2 and NEON (≤ 6 rows,
    // `Micro::row_tiles`) and on `bfmmla` (8 rows from an even one, `mmla::ROWS`), else ≤ MR of
    // equal height (AVX-512: a 4-row tail tile is latency-bound); 16, 8 or 32 pixels at a time.
    let six = six_rows(d.isa);
    let mmla = d.isa == Isa::Bf16;
    let packed_tiles = match six {
        Some(micro) => Some(micro.row_tiles(cout)),
        None if mmla => Some((0..=cout.div_ceil(mmla::ROWS)).map(|t| (t * mmla::ROWS).min(cout)).collect()),
        None => None,
    };
    let blocks: Vec<Vec<(usize, usize)>> = if let Some(b) = packed_tiles {
        let tiles = b.len() - 1;
        let nb = (cout * kp * 4).div_ceil(A_BLOCK_BYTES).clamp(1, tiles);
        (0..nb).map(|blk| (tiles * blk / nb..tiles * (blk + 1) / nb).map(|t| (b[t], b[t + 1])).collect()).collect()
    } else {
        let nb = (cout * kp * 4).div_ceil(A_BLOCK_BYTES).clamp(1, cout);
        (0..nb)
            .map(|blk| {
                let (o0, o1) = (cout * blk / nb, cout * (blk + 1) / nb);
                let np = (o1 - o0).div_ceil(MR);
                (0..np).map(|p| (o0 + (o1 - o0) * p / np, o0 + (o1 - o0) * (p + 1) / np)).collect()
            })
            .collect()
    };
    let step = if six.is_some() {
        16
    } else if mmla {
        mmla::PIX
    } else {
        32
    };
    // Words a pixel of a slab row takes, in one channel row (two on `bfmmla`: a quad's).
    let pw = if mmla { 2 } else { 1 };
    // Tap (ky, kx) of a pixel is ky slab rows below it and kx pixels right.
    let taps: [usize; 9] = std::array::from_fn(|t| (t / 3) * kc * wp + pw * (t % 3));
    // The weights: row o output channel o's taps (on the 6-row routes, each row tile's
    // interleaved).
    let weights = Mat::from_ptr(d.words.as_ptr(), cout, kp, kp);
    for panels in &blocks {
        for y in y0..y1 {
            let ry = y - y0;
            for x0 in (0..w).step_by(step) {
                let nv = (w - x0).min(step);
                // The slab's channel rows (quad rows on `bfmmla`) at pixel x0 of slab row ry:
                // tap (0, 0) of the tile's pixels, every other tap `taps` further.
                let b = Mat::from_ptr(slab.as_ptr().wrapping_add(ry * kc * wp + pw * x0), kc / pw, pw * step, pw * wp);
                for &(r0, r1) in panels {
                    let c = out.block(r0, y * w + x0, r1 - r0, nv);
                    let res = residual.map(|r| r.as_raw().block(r0, y * w + x0, r1 - r0, nv));
                    let bias = bias.as_ptr().wrapping_add(r0);
                    // The tile's weights interleaved: a row per (tap, channel) (6-row routes).
                    let a = Mat::from_ptr(weights.row(r0) as *const f32, kp, r1 - r0, r1 - r0);
                    // `d` exists only on a direct route (AVX2, AVX-512F or NEON for f32,
                    // AVX512-BF16 or `bfmmla` for bf16), which `route` gives only where the CPU
                    // has it (or `bfmmla`'s portable twin, `d.emulated`, in the tests).
                    // The arms' SAFETY: the CPU has the route's instructions (above); the
                    // tile's r1 - r0 rows of kp weights (on `bfmmla` its whole row pairs), and
                    // its bias, are inside the op's (asserted by `run_direct`); each tap's 16
                    // (32 on AVX-512, 8 pixels of 2 on `bfmmla`) words of the slab's kc / pw
                    // channel rows are inside the slab (its rows are pw · (w + 2) words and it
                    // has 32 to spare past the last: at most 14 are read there); `c` and `res`
                    // are inside `out` and `residual` (asserted by `block`).
                    match d.isa {
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: as above, on AVX2 and FMA.
                        Isa::Avx2 => unsafe { crate::simd::avx2::kernel(a, b.cast(), &taps, bias, res, c, Prefetch::NONE) },
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: as above, on AVX-512F (AVX512-BF16 in bf16).
                        Isa::Avx512 | Isa::Avx512Bf16 => unsafe { avx512::kernel(d.bf16, weights.block(r0, 0, r1 - r0, kp), b, &taps, bias, res, c) },
                        #[cfg(target_arch = "aarch64")]
                        // SAFETY: as above, on NEON (every aarch64 CPU).
                        Isa::Neon => unsafe { crate::simd::neon::kernel(a, b.cast(), &taps, bias, res, c, Prefetch::NONE) },
                        // SAFETY: as above, on bf16 (or the portable twin); the tile's row pairs
                        // start at row r0 (even: `mmla::ROWS` apart) of the packed layout, their
                        // padding row included.
                        Isa::Bf16 => unsafe { mmla_tile(d.emulated)(weights.row(r0), b, &taps, bias, res, c) },
                        isa => unreachable!("direct conv3x3 on the {isa} route, which this CPU lacks"),
                    }
                }
            }
        }
    }
}

/// The `bfmmla` route's register tile: the instruction's (aarch64), or its portable twin's.
fn mmla_tile(emulated: bool) -> mmla::Tile {
    #[cfg(target_arch = "aarch64")]
    if !emulated {
        return neon::kernel;
    }
    assert!(emulated, "the direct bfmmla route exists only on aarch64");
    mmla::kernel_emulated
}

/// The 6-row kernel (with taps) of direct route `isa`, if it takes one: AVX2's or NEON's
/// (AVX-512 and AVX512-BF16 have their own tiles, `avx512::kernel`).
fn six_rows(isa: Isa) -> Option<crate::simd::sgemm::Micro> {
    match isa {
        Isa::Avx2 => Some(crate::simd::sgemm::Micro::Avx2),
        Isa::Neon => Some(crate::simd::sgemm::Micro::Neon),
        _ => None,
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512;
pub mod int8;
mod mmla;
#[cfg(target_arch = "aarch64")]
mod neon;
mod pixels;
pub mod tiles;
pub mod winograd;

/// One use of a [`Conv3x3Op`]: ReLU on the input, 2x bilinear upsample of the input (needs
/// [`Conv3x3Op::fuses_upsample`]); as a `CustomOp2`, the second input is a residual added to the
/// output.
pub struct Conv3x3Call<'a> {
    op: &'a Conv3x3Op,
    relu_input: bool,
    upsample2x: bool,
}

impl Conv3x3Call<'_> {
    fn out_hw(&self, layout: &Layout) -> Result<(usize, usize, usize)> {
        let (c, h, w) = layout.shape().dims3()?;
        if c != self.op.cin {
            candle_core::bail!("conv3x3: input has {c} channels, weight expects {}", self.op.cin);
        }
        Ok(if self.upsample2x { (c, 2 * h, 2 * w) } else { (c, h, w) })
    }
}

impl CustomOp1 for Conv3x3Call<'_> {
    fn name(&self) -> &'static str {
        "conv3x3-replicate"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, h, w) = self.out_hw(layout)?;
        let x = contiguous(storage, layout, "conv3x3")?;
        let out = self.op.run(x, h, w, self.relu_input, self.upsample2x, None)?;
        Ok((CpuStorage::F32(out), Shape::from((self.op.cout, h, w))))
    }
}

impl CustomOp2 for Conv3x3Call<'_> {
    fn name(&self) -> &'static str {
        "conv3x3-replicate-add"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, h, w) = self.out_hw(l1)?;
        if l2.shape().dims() != [self.op.cout, h, w] {
            candle_core::bail!("conv3x3: residual {:?} does not match the output ({}, {h}, {w})", l2.shape(), self.op.cout);
        }
        let x = contiguous(s1, l1, "conv3x3")?;
        let res = contiguous(s2, l2, "conv3x3 residual")?;
        let out = self.op.run(x, h, w, self.relu_input, self.upsample2x, Some(res))?;
        Ok((CpuStorage::F32(out), Shape::from((self.op.cout, h, w))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::matmul::bf16::round_bf16;
    use candle_core::{Device, Tensor};

    use crate::simd::test_values as rand;

    /// torch's bilinear 2x (align_corners=False) in f64, straight from its source-index formula.
    fn upsample_ref(x: &[f32], c: usize, h: usize, w: usize) -> Vec<f32> {
        let src = |d: usize, n: usize| -> (usize, usize, f64) {
            let s = ((d as f64 + 0.5) / 2.0 - 0.5).max(0.0);
            let i0 = (s.floor() as usize).min(n - 1);
            ((i0), (i0 + 1).min(n - 1), s - i0 as f64)
        };
        let mut out = vec![0f32; c * 4 * h * w];
        for ch in 0..c {
            for y in 0..2 * h {
                let (y0, y1, ly) = src(y, h);
                for xx in 0..2 * w {
                    let (x0, x1, lx) = src(xx, w);
                    let p = |yy: usize, xq: usize| x[(ch * h + yy) * w + xq] as f64;
                    let v = (1.0 - ly) * ((1.0 - lx) * p(y0, x0) + lx * p(y0, x1)) + ly * ((1.0 - lx) * p(y1, x0) + lx * p(y1, x1));
                    out[(ch * 2 * h + y) * 2 * w + xx] = v as f32;
                }
            }
        }
        out
    }

    /// Replicate-padded 3x3 conv in f64 (of bf16-rounded input and weights when `bf16`);
    /// returns the result and, per output, the sum of |terms| (the scale of the f32
    /// accumulation error).
    fn conv_ref(x: &[f32], wt: &[f32], bias: &[f32], (cin, cout, h, w): (usize, usize, usize, usize), relu: bool, bf16: bool) -> (Vec<f64>, Vec<f64>) {
        let round = |v: f32| if bf16 { round_bf16(v) as f64 } else { v as f64 };
        let mut out = vec![0f64; cout * h * w];
        let mut mag = vec![0f64; cout * h * w];
        for o in 0..cout {
            for y in 0..h {
                for xx in 0..w {
                    let (mut s, mut m) = (bias[o] as f64, bias[o].abs() as f64);
                    for ci in 0..cin {
                        for ky in 0..3 {
                            for kx in 0..3 {
                                let sy = (y + ky).saturating_sub(1).min(h - 1);
                                let sx = (xx + kx).saturating_sub(1).min(w - 1);
                                let mut v = x[(ci * h + sy) * w + sx];
                                if relu {
                                    v = v.max(0.0);
                                }
                                let t = round(v) * round(wt[(o * cin + ci) * 9 + ky * 3 + kx]);
                                s += t;
                                m += t.abs();
                            }
                        }
                    }
                    out[(o * h + y) * w + xx] = s;
                    mag[(o * h + y) * w + xx] = m;
                }
            }
        }
        (out, mag)
    }

    /// Every route at every level this machine can run, against the reference: odd channel
    /// counts, widths that are not a multiple of the 32-pixel panel, a single row, ReLU,
    /// residual and the fused upsample. The ops are built inside `isa::with_isa`, as a model
    /// is, and each takes its level's route; levels that share a route give the same bits.
    #[test]
    fn routes_match_reference_at_every_level() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        // (cin, cout, h, w, relu, upsample, residual)
        let cases = [
            (5, 7, 9, 40, true, false, false),
            (64, 32, 6, 70, false, false, true),
            (3, 13, 1, 33, true, false, true),
            (16, 24, 5, 1, false, false, false),
            (6, 5, 4, 17, false, true, false),
            (9, 12, 3, 20, false, true, true),
            (300, 25, 4, 36, false, false, false),
            // Several slab tiles of rows (y0 > 0, a shorter last one) on every direct route.
            (300, 9, 25, 36, false, false, true),
            // The Winograd route (f32 at AVX2 and NEON, 64 channels and more): odd sizes (a tile cut by
            // the edge), one row, one column, a tile row in several tasks.
            (64, 70, 7, 37, true, false, true),
            (96, 64, 1, 20, false, false, false),
            (64, 64, 5, 1, true, false, false),
            (64, 64, 4, 300, false, false, true),
            (64, 64, 6, 20, false, true, false),
            // ... and at AVX-512, from 256 channels.
            (256, 256, 3, 5, true, false, true),
            // Upsampled calls of an op built for them: Winograd on the input itself where 64
            // channels and more come in (four phases of 16 and more go out).
            (64, 32, 5, 7, false, true, true),
            (64, 16, 1, 9, false, true, false),
            (80, 17, 6, 1, false, true, false),
            (64, 8, 3, 4, false, true, false),
            (256, 64, 2, 3, false, true, true),
        ];
        for &(cin, cout, h, w, relu, up, with_res) in &cases {
            let (ih, iw) = (h, w);
            let (oh, ow) = if up { (2 * h, 2 * w) } else { (h, w) };
            let x = rand(&mut seed, cin * ih * iw);
            let wt = rand(&mut seed, cout * cin * 9);
            let bias = rand(&mut seed, cout);
            let res = rand(&mut seed, cout * oh * ow);
            let res = with_res.then_some(&res[..]);
            let wtensor = Tensor::from_vec(wt.clone(), (cout, cin, 3, 3), &Device::Cpu).unwrap();
            let xin = if up { upsample_ref(&x, cin, ih, iw) } else { x.clone() };
            for bf16 in [false, true] {
                let (want, mag) = conv_ref(&xin, &wt, &bias, (cin, cout, oh, ow), relu && !up, bf16);
                // bf16 rounding of the (upsampled) input may land on the other side of a tie in
                // the f32 vs f64 upsample: allow one bf16 ulp per term there.
                let rel = if bf16 && up { 8e-3 } else { 1e-5 };
                let check = |route: &str, got: &[f32]| {
                    for i in 0..want.len() {
                        let r = res.map_or(0.0, |r| r[i] as f64);
                        assert!(
                            (got[i] as f64 - (want[i] + r)).abs() <= rel * mag[i] + 1e-6,
                            "{route} bf16={bf16} case {cin}x{cout} {oh}x{ow} relu={relu} up={up} res={with_res}: [{i}] {} vs {}",
                            got[i],
                            want[i] + r
                        );
                    }
                };
                if bf16 {
                    // The `bfmmla` route's layout and loops on its portable twin, on every
                    // machine (on aarch64 the level loop below runs the instruction at `bf16`).
                    let twin = Conv3x3Op {
                        weight: wtensor.clone(),
                        bias: bias.clone(),
                        cin,
                        cout,
                        packed: None,
                        direct: Some(Direct { emulated: true, ..pack_direct(&wt, cin, cout, true, Isa::Bf16) }),
                        winograd: None,
                        up: None,
                        tiles: None,
                        up_tiles: None,
                    };
                    check("bfmmla twin", &twin.run(&x, oh, ow, relu, up, res).unwrap());
                }
                // (direct route group, Winograd, the im2col route's bf16 products) -> the first
                // level's output.
                type Group = (Option<Isa>, bool, Option<Isa>);
                let mut by_route: Vec<(Group, Vec<f32>)> = Vec::new();
                for level in isa::levels() {
                    let op = isa::with_isa(level, || Conv3x3Op::new(wtensor.clone(), bias.clone(), cin, cout, bf16)).unwrap();
                    let wino = winograd_level(level, bf16) && super::winograd::Winograd::worth(level, cin, cout);
                    assert_eq!(op.winograd(), wino, "{level} bf16={bf16}");
                    let direct = route(level, bf16).filter(|_| !wino);
                    assert_eq!(op.direct.as_ref().map(|d| d.isa), direct, "{level} bf16={bf16}");
                    assert_eq!(op.fuses_upsample(), direct.is_some());
                    // bf16 on AMX: the direct tile route, in place of im2col's packed weight.
                    let tiles = bf16 && level == Isa::Amx;
                    assert_eq!(op.tiles.is_some(), tiles, "{level} bf16={bf16}");
                    assert_eq!(
                        op.packed.as_ref().map(|p| p.isa()),
                        (bf16 && direct.is_none() && !tiles).then(|| crate::model::cpu::matmul::bf16::route(level))
                    );
                    // Built for upsampled calls: the Winograd route takes them where it pays.
                    let ups = isa::with_isa(level, || Conv3x3Op::new_upsampling(wtensor.clone(), bias.clone(), cin, cout, bf16)).unwrap();
                    let up_wino = winograd_level(level, bf16) && super::winograd::Winograd::worth(level, cin, 4 * cout);
                    assert_eq!(ups.upsampled_winograd(), up_wino, "{level} bf16={bf16} {cin}x{cout}");
                    // bf16 on AMX: the phases on the tiles, and no other weights.
                    assert_eq!(ups.up_tiles.is_some(), tiles, "{level} bf16={bf16}");
                    if tiles {
                        assert!(ups.tiles.is_none() && ups.packed.is_none() && ups.fuses_upsample(), "{level}: only the upsampled route's weights");
                    }
                    if up_wino {
                        assert!(!ups.winograd() && ups.direct.is_none() && ups.packed.is_none(), "{level}: only the upsampled route's weights");
                        if !up {
                            // A plain call still works, on the im2col route.
                            check(&format!("{level} built for upsampling, plain call"), &ups.run(&x, oh, ow, relu, false, res).unwrap());
                        }
                    }
                    if up && ups.fuses_upsample() {
                        check(&format!("{level} built for upsampling"), &ups.run(&x, oh, ow, relu, up, res).unwrap());
                    }
                    if up && !op.fuses_upsample() {
                        assert!(op.run(&x, oh, ow, relu, up, res).is_err(), "only the direct route fuses the upsample");
                        if wino {
                            // The caller upsamples first (`Conv3x3::forward_upsampled`).
                            check(&format!("{level} winograd, upsampled first"), &op.run(&xin, oh, ow, false, false, res).unwrap());
                        }
                        continue;
                    }
                    let got = op.run(&x, oh, ow, relu, up, res).unwrap();
                    check(&format!("{level}"), &got);
                    // The f32 direct kernels (AVX2, AVX-512F) do the same arithmetic in the same
                    // order: one group; the Winograd route is its own, and so is each route of
                    // the bf16 products under im2col (rounded f32, AMX tiles).
                    let products = (bf16 && direct.is_none()).then(|| crate::model::cpu::matmul::bf16::route(level));
                    let group = (if direct == Some(Isa::Avx2) { Some(Isa::Avx512) } else { direct }, wino, products);
                    match by_route.iter().find(|(r, _)| *r == group) {
                        Some((_, first)) => assert!(*first == got, "{level} bf16={bf16}: not the bits of the same route at a lower level"),
                        None => by_route.push((group, got)),
                    }
                    // The im2col route with this level's GEMM, where the direct one was taken.
                    if (direct.is_some() || wino) && !up {
                        let im2col = Conv3x3Op {
                            weight: op.weight.clone(),
                            bias: bias.clone(),
                            cin,
                            cout,
                            packed: bf16.then(|| Arc::new(PackedA::build(&wt, cout, cin * 9, level))),
                            direct: None,
                            winograd: None,
                            up: None,
                            tiles: None,
                            up_tiles: None,
                        };
                        check(&format!("{level} im2col"), &im2col.run(&x, oh, ow, relu, false, res).unwrap());
                    }
                }
            }
        }
    }

    /// An empty map through the upsampled Winograd route: an empty output, no panic.
    #[test]
    fn upsampled_winograd_takes_an_empty_map() {
        let mut seed = 11u64;
        let (cin, cout) = (64, 16);
        let wt = Tensor::from_vec(rand(&mut seed, cout * cin * 9), (cout, cin, 3, 3), &Device::Cpu).unwrap();
        for level in isa::levels() {
            let op = isa::with_isa(level, || Conv3x3Op::new_upsampling(wt.clone(), vec![0.5; cout], cin, cout, false)).unwrap();
            if !op.upsampled_winograd() {
                continue;
            }
            for (h, w) in [(0, 6), (4, 0), (0, 0)] {
                assert!(op.run(&[], h, w, false, true, None).unwrap().is_empty(), "{level}: {h}x{w}");
            }
        }
    }

    /// The three shifted copies against [`pairs`] read at the clamped columns, at every level:
    /// one pixel, widths on either side of a vector, rows padded or not, with the ReLU or not.
    #[test]
    fn three_copies_match_the_shifted_pairs() {
        let mut seed = 11u64;
        for (w, n) in [(1usize, 1usize), (1, 32), (15, 16), (16, 16), (17, 32), (33, 40), (104, 128)] {
            let a = rand(&mut seed, w);
            let b = rand(&mut seed, w);
            for relu in [false, true] {
                let mut p = vec![0u32; w];
                pairs(Isa::Portable, &a, &b, relu, &mut p);
                for level in isa::levels() {
                    let mut got = [vec![7u32; n], vec![7u32; n], vec![7u32; n]];
                    let [d0, d1, d2] = &mut got;
                    pairs3(crate::model::cpu::matmul::bf16::route(level), &a, &b, relu, [d0, d1, d2]);
                    for (kx, row) in got.iter().enumerate() {
                        let want: Vec<u32> = (0..n).map(|c| if c < w { p[(c + kx).saturating_sub(1).min(w - 1)] } else { 0 }).collect();
                        assert_eq!(row, &want, "{level} w={w} n={n} kx={kx} relu={relu}");
                    }
                }
            }
        }
    }

    /// The int8 slab's three shifted copies at every level against `to_u8` of each value at
    /// the clamped columns: one pixel, widths on either side of a vector, ties, NaN, the
    /// infinities, values past the range, with the ReLU or not (zero point 0 then, as the
    /// band's range starts at 0).
    #[test]
    fn int8_copies_match_to_u8_at_every_level() {
        let mut seed = 13u64;
        for (w, n) in [(1usize, 1usize), (1, 32), (15, 16), (17, 32), (33, 48)] {
            let mut rows: Vec<Vec<f32>> = (0..4).map(|_| rand(&mut seed, w)).collect();
            let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.5 / 64.0, 2.5 / 64.0, 1e30, -1e30];
            for (i, v) in specials.into_iter().enumerate() {
                rows[i % 4][(3 * i) % w] = v;
            }
            let rows = [&rows[0][..], &rows[1][..], &rows[2][..], &rows[3][..]];
            for (relu, zero) in [(false, 100), (true, 0)] {
                let inv = 64.0;
                let word = |c: usize| u32::from_le_bytes(rows.map(|r| to_u8(if relu { r[c].max(0.0) } else { r[c] }, inv, zero as f32) as u8));
                for level in isa::levels() {
                    let mut got = [vec![7u32; n], vec![7u32; n], vec![7u32; n]];
                    let [d0, d1, d2] = &mut got;
                    quads3(level, rows, relu, (inv, zero), [d0, d1, d2]);
                    for (kx, row) in got.iter().enumerate() {
                        let want: Vec<u32> = (0..n).map(|c| if c < w { word((c + kx).saturating_sub(1).min(w - 1)) } else { 0 }).collect();
                        assert_eq!(row, &want, "{level} w={w} n={n} kx={kx} relu={relu}");
                    }
                }
            }
        }
    }

    /// The vector bf16 pair conversion gives the scalar one's bits at every level.
    #[test]
    fn pairs_match_scalar_at_every_level() {
        let mut seed = 7u64;
        let mut a = rand(&mut seed, 301);
        // Ties and denormals (NaN payloads may differ: only "is NaN" is promised).
        a[4] = 1e-40;
        a[5] = f32::from_bits(0x3f80_8000);
        let b = rand(&mut seed, 301);
        for relu in [false, true] {
            let mut want = vec![0u32; 301];
            pairs(Isa::Portable, &a, &b, relu, &mut want);
            for level in isa::levels() {
                let mut got = vec![1u32; 301];
                pairs(crate::model::cpu::matmul::bf16::route(level), &a, &b, relu, &mut got);
                assert_eq!(got, want, "{level} relu={relu}");
            }
        }
    }
}
