//! The decoder's convolutions as int8 products for `--precision int8`: the 3x3 ones (replicate
//! padding, optional ReLU on the input, optional residual; also after a 2x bilinear upsample),
//! the 1x1 ones and the 2x2 stride-2 transposed ones. Weights per output channel as the
//! linears', activations per pixel (over its channels, asymmetric u8), int32 sums per tap.
//!
//! A 1x1 convolution is the centre tap alone; a transposed one a 1x1 convolution to its four
//! output phases' channels, and the 3x3 one after an upsample a 3x3 convolution of its input to
//! its four phases' kernels (`conv3x3::phased_weights`): both then interleave the phases.
//!
//! A 3x3 convolution is nine products, one per tap, each over the input channels (K = cin), so
//! that each pixel keeps its own scale: tap t of output pixel p reads input pixel p + t, whose
//! scale s and zero point z apply to the whole tap. Per tap, in f32:
//! `y[o,p] += s_w[o] · (s[p+t] · Σ_c u[p+t,c]·q[o,c,t] − s[p+t]·z[p+t] · Σ_c q[o,c,t])`.
//!
//! The input is quantised once into "quad planes": for each group of four channels a plane of
//! the padded image (replicate border in place), each pixel one i32 of its four u8. A register
//! tile is 6 output channels × 32 pixels of one output row: per tap and quad, two vector loads
//! of 16 pixels at the tap's offset (no unfolding: every tap reads the same planes shifted), six
//! broadcast weight words, twelve `vpdpbusd`; the output is written channel-major, as the f32
//! kernels write it.
//!
//! Routes, as the linears' ([`route`]): on AMX the tiles' ([`super::tiles`], the input
//! quantised per band of rows rather than per pixel), the kernel above on AVX512-VNNI, a 6 × 16 tile of
//! ymm registers on AVX-VNNI (`avxvnni`), a 6 × 16 tile of NEON registers by `sdot` (dotprod)
//! or `usdot` (i8mm) on aarch64 (`neon`); elsewhere the same quantisation emulated (the input
//! quantised and dequantised, convolved with the dequantised weights by the f32 route).

use rayon::prelude::*;

use super::pixels::quantise_pixels;
use super::tiles::{Kind, TileConv, INT8_MAX_TAPS_CIN};
use super::{interleave_phases, phased_weights, Conv3x3Op};
use crate::model::cpu::conv1x1::Conv1x1Op;
use crate::model::cpu::matmul::int8::{quantise_weights, route, Route};
use crate::model::cpu::tensor::contiguous;
use crate::simd::isa::Isa;

/// Output channels per register tile.
pub(super) const TILE_CH: usize = 6;
/// Pixels per register tile (two zmm of 16).
pub(super) const TILE_PX: usize = 32;
/// Output-channel tiles per task.
const TILES_PER_TASK: usize = 8;

pub struct QuantConv {
    cin: usize,
    /// The products' output channels: 4x the convolution's for an upsampling or transposed one.
    cout: usize,
    /// 9 (3x3), or 1 (1x1: the centre tap).
    taps: usize,
    /// Built by [`QuantConv::new_upsampling`] or [`QuantConv::new_transposed`]: the output is
    /// twice the input's size, its four phases interleaved.
    upsampling: bool,
    store: Store,
}

enum Store {
    /// AMX tiles (`tdpbsud`), with the bias of the convolution's own output channels.
    Tiles(Box<TileConv>, Vec<f32>),
    /// The weights for the kernel of a dot-product route (VNNI, or Arm's `sdot` / `usdot`).
    Dot(DotWeights, Route),
    /// The f32 routes on the dequantised weights: a 3x3 convolution, or a 1x1 one.
    Emulated(Box<Conv3x3Op>),
    EmulatedPointwise(Box<Conv1x1Op>),
}

/// The dot-product kernels' weights, each padded with zeros to whole tiles of [`TILE_CH`] channels:
/// for each tile, tap (9, or the centre alone), quad and channel of the tile, the word of its
/// four s8 weights (zero past cout or cin); s_w, Σ_c q per tap (as f32: exact, |Σ| < 2²⁴), and
/// the bias, per channel.
struct DotWeights {
    words: Vec<i32>,
    scale: Vec<f32>,
    sums: Vec<f32>,
    bias: Vec<f32>,
}

impl QuantConv {
    /// A 3x3 convolution from its (cout, cin, 3, 3) weight, for the route of `level`.
    pub fn new(w: &[f32], bias: Vec<f32>, cin: usize, cout: usize, level: Isa) -> candle_core::Result<Self> {
        Self::checked(w, &bias, cout * cin * 9, cout)?;
        if on_tiles(level, cin, 9) {
            return Ok(Self::tiles(TileConv::new(w, cin, cout, Kind::Int8, false), bias, cin, cout, 9, false));
        }
        Self::build(w, bias, cin, cout, 9, level, false)
    }

    /// A 1x1 convolution from its (cout, cin) weight.
    pub fn new_pointwise(w: &[f32], bias: Vec<f32>, cin: usize, cout: usize, level: Isa) -> candle_core::Result<Self> {
        Self::checked(w, &bias, cout * cin, cout)?;
        if on_tiles(level, cin, 1) {
            return Ok(Self::tiles(TileConv::new_pointwise(w, cin, cout, Kind::Int8, false), bias, cin, cout, 1, false));
        }
        Self::build(w, bias, cin, cout, 1, level, false)
    }

    /// `nn.ConvTranspose2d(cin, cout, 2, stride=2)` from its weight as (cout·4, cin), row
    /// o·4 + di·2 + dj (PyTorch's (cin, cout, 2, 2) transposed): a 1x1 convolution to the four
    /// phases' channels, phase-major, interleaved into (cout, 2h, 2w).
    pub fn new_transposed(w: &[f32], bias: Vec<f32>, cin: usize, cout: usize, level: Isa) -> candle_core::Result<Self> {
        Self::checked(w, &bias, 4 * cout * cin, cout)?;
        if on_tiles(level, cin, 1) {
            return Ok(Self::tiles(TileConv::new_transposed(w, cin, cout, Kind::Int8, false), bias, cin, 4 * cout, 1, true));
        }
        let mut phased = vec![0f32; 4 * cout * cin];
        for (row, dst) in phased.chunks_exact_mut(cin.max(1)).enumerate().take(4 * cout) {
            let (ph, o) = (row / cout, row % cout);
            dst.copy_from_slice(&w[(o * 4 + ph) * cin..][..cin]);
        }
        Self::build(&phased, bias.repeat(4), cin, 4 * cout, 1, level, true)
    }

    /// An error unless the weight holds `want` values (or more) and the bias `cout`.
    fn checked(w: &[f32], bias: &[f32], want: usize, cout: usize) -> candle_core::Result<()> {
        if w.len() < want || bias.len() != cout {
            candle_core::bail!("conv int8: {} weights and {} biases, for {want} and {cout}", w.len(), bias.len());
        }
        Ok(())
    }

    /// conv3x3(upsample_bilinear_2x(x)) (align_corners=False, a bilinear `Resampler`'s) from its
    /// (cout, cin, 3, 3) weight: the four output phases' kernels on x itself (as the f32
    /// route's `UpWinograd`), quantised per phase and channel, with x quantised per pixel
    /// before the upsample (4x fewer pixels than after it); the phases interleaved at the end.
    pub fn new_upsampling(w: &[f32], bias: Vec<f32>, cin: usize, cout: usize, level: Isa) -> candle_core::Result<Self> {
        Self::checked(w, &bias, cout * cin * 9, cout)?;
        if on_tiles(level, cin, 9) {
            return Ok(Self::tiles(TileConv::new_upsampling(w, cin, cout, Kind::Int8, false), bias, cin, 4 * cout, 9, true));
        }
        Self::build(&phased_weights(w, cin, cout), bias.repeat(4), cin, 4 * cout, 9, level, true)
    }

    /// The op on the tiles' `conv`: `cout` its products' output channels, `bias` the
    /// convolution's own.
    fn tiles(conv: TileConv, bias: Vec<f32>, cin: usize, cout: usize, taps: usize, upsampling: bool) -> Self {
        Self { cin, cout, taps, upsampling, store: Store::Tiles(Box::new(conv), bias) }
    }

    /// `upsampling`: the output is four phases' channels (phase-major), interleaved.
    fn build(w: &[f32], bias: Vec<f32>, cin: usize, cout: usize, taps: usize, level: Isa, upsampling: bool) -> candle_core::Result<Self> {
        let (scale, q) = quantise_weights(w, cout, cin * taps);
        let store = match route(level).without_tiles() {
            route @ (Route::Avx512Vnni | Route::AvxVnni | Route::Dotprod | Route::I8mm) => {
                let quads = cin.div_ceil(4);
                let tiles = cout.div_ceil(TILE_CH);
                let mut words = vec![0i32; tiles * taps * quads * TILE_CH];
                let mut sums = vec![0f32; tiles * TILE_CH * taps];
                for o in 0..cout {
                    let (tile, r) = (o / TILE_CH, o % TILE_CH);
                    for t in 0..taps {
                        let qv = |c: usize| if c < cin { q[(o * cin + c) * taps + t] } else { 0 };
                        for quad in 0..quads {
                            let b = [qv(4 * quad) as u8, qv(4 * quad + 1) as u8, qv(4 * quad + 2) as u8, qv(4 * quad + 3) as u8];
                            words[((tile * taps + t) * quads + quad) * TILE_CH + r] = i32::from_le_bytes(b);
                        }
                        let sum: i32 = (0..cin).map(|c| qv(c) as i32).sum();
                        sums[o * taps + t] = sum as f32;
                    }
                }
                let (mut scale, mut bias) = (scale, bias);
                scale.resize(tiles * TILE_CH, 0.0);
                bias.resize(tiles * TILE_CH, 0.0);
                Store::Dot(DotWeights { words, scale, sums, bias }, route)
            }
            // (The tile routes never come here: the constructors took the tiles where they
            // could (`on_tiles`), and `without_tiles` above gives the rest of an AMX CPU's ops
            // the VNNI kernel, and the tiles' emulation the emulated route.)
            Route::Emulated | Route::Amx | Route::AmxEmulated => {
                let dq: Vec<f32> = q.iter().enumerate().map(|(e, &v)| v as f32 * scale[e / (cin * taps)]).collect();
                if taps == 1 {
                    Store::EmulatedPointwise(Box::new(crate::simd::isa::with_isa(level, || Conv1x1Op::new(dq, bias, cin, cout))?))
                } else {
                    let t = candle_core::Tensor::from_vec(dq, (cout, cin, 3, 3), &candle_core::Device::Cpu)?;
                    Store::Emulated(Box::new(crate::simd::isa::with_isa(level, || Conv3x3Op::new_direct(t, bias, cin, cout, false))?))
                }
            }
        };
        Ok(Self { cin, cout, taps, upsampling, store })
    }

    /// The output's channels and size from an input of h x w.
    fn out_dims(&self, h: usize, w: usize) -> (usize, usize, usize) {
        if self.upsampling {
            (self.cout / 4, 2 * h, 2 * w)
        } else {
            (self.cout, h, w)
        }
    }

    /// Whether it was built by [`QuantConv::new_upsampling`] (and takes only upsampled calls)
    /// or [`QuantConv::new_transposed`].
    pub fn upsampling(&self) -> bool {
        self.upsampling
    }

    /// Whether the products run as int8 (else emulated).
    pub fn native(&self) -> bool {
        matches!(self.store, Store::Dot(..) | Store::Tiles(..))
    }

    /// Whether the products run on AMX tiles.
    pub fn on_tiles(&self) -> bool {
        matches!(self.store, Store::Tiles(..))
    }

    pub fn call(&self, relu_input: bool) -> QuantConvCall<'_> {
        QuantConvCall { op: self, relu_input }
    }

    /// out (cout, h, w) from x (cin, h, w) [+ residual]; for an upsampling or transposed op
    /// (cout, 2h, 2w) from x (cin, h, w): h and w are the input's, the residual at the output's
    /// size. `relu` (on the input) is refused there: whether it comes before the upsample or
    /// after is not this op's to choose.
    pub fn run(&self, x: &[f32], h: usize, w: usize, relu: bool, residual: Option<&[f32]>) -> candle_core::Result<Vec<f32>> {
        let (oc, oh, ow) = self.out_dims(h, w);
        if relu && self.upsampling {
            candle_core::bail!("conv int8: a ReLU on the input of an upsampling or transposed convolution");
        }
        if x.len() < self.cin * h * w || residual.is_some_and(|r| r.len() < oc * oh * ow) {
            candle_core::bail!("conv int8: {} input and {:?} residual values for {}->{oc} channels at {h}x{w}", x.len(), residual.map(<[f32]>::len), self.cin,);
        }
        if let Store::Tiles(conv, bias) = &self.store {
            return Ok(if self.upsampling { conv.run_upsampled(x, (h, w), bias, residual) } else { conv.run(x, (h, w), relu, bias, residual) });
        }
        if self.upsampling {
            let y = self.product(x, h, w, relu, None)?;
            return Ok(interleave_phases(&y, h, w, oc, residual));
        }
        self.product(x, h, w, relu, residual)
    }

    /// The products' (cout, h, w) from x (cin, h, w) [+ residual].
    fn product(&self, x: &[f32], h: usize, w: usize, relu: bool, residual: Option<&[f32]>) -> candle_core::Result<Vec<f32>> {
        // The emulated routes' input: quantised, and dequantised for the f32 products.
        let emulated = || QuadPlanes::new(x, self.cin, h, w, relu).dequantised(self.cin, h, w);
        match &self.store {
            Store::Emulated(op) => op.run_f32(&emulated(), h, w, false, residual),
            Store::EmulatedPointwise(op) => op.run(&emulated(), h * w, residual),
            Store::Dot(weights, route) => Ok(self.run_dot(x, h, w, relu, residual, weights, *route)),
            Store::Tiles(..) => unreachable!("conv int8: the tiles' op runs whole (`run`)"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(unused_variables, clippy::never_loop))]
    fn run_dot(&self, x: &[f32], h: usize, w: usize, relu: bool, residual: Option<&[f32]>, weights: &DotWeights, route: Route) -> Vec<f32> {
        let (cin, cout, taps) = (self.cin, self.cout, self.taps);
        let DotWeights { words, scale, sums, bias } = weights;
        let planes = QuadPlanes::new(x, cin, h, w, relu);
        let quads = cin.div_ceil(4);
        let tiles = cout.div_ceil(TILE_CH);
        let hw = h * w;
        // Every value is written below (the tasks cover every row, channel and pixel): no zeros
        // first (they cost as much as the quantisation).
        let mut out: Vec<f32> = Vec::with_capacity(cout * hw);
        if cout * hw == 0 {
            return out;
        }
        let blocks = tiles.div_ceil(TILES_PER_TASK);
        // Pixels per tile: two vectors on x86-64 (16 lanes, or 8 on AVX-VNNI), four on NEON.
        let px = match route {
            #[cfg(target_arch = "x86_64")]
            Route::AvxVnni => avxvnni::TILE_PX,
            #[cfg(target_arch = "aarch64")]
            Route::Dotprod | Route::I8mm => neon::TILE_PX,
            _ => TILE_PX,
        };
        // Each tap's offset in the padded planes from the tile's (dy, dx) = (0, 0).
        let offsets: Vec<usize> = if taps == 9 { (0..9).map(|t| (t / 3) * planes.wp + t % 3).collect() } else { vec![planes.wp + 1] };
        let outp = crate::simd::SendPtr(out.as_mut_ptr());
        let outp = &outp;
        (0..h * blocks).into_par_iter().with_max_len(1).for_each(|job| {
            let (y, block) = (job / blocks, job % blocks);
            for x0 in (0..w).step_by(px) {
                let nv = (w - x0).min(px);
                for tile in block * TILES_PER_TASK..((block + 1) * TILES_PER_TASK).min(tiles) {
                    let o0 = tile * TILE_CH;
                    let mv = (cout - o0).min(TILE_CH);
                    let args = ConvTile {
                        planes: &planes,
                        base: y * planes.wp + x0,
                        offsets: &offsets,
                        weights: &words[tile * taps * quads * TILE_CH..(tile + 1) * taps * quads * TILE_CH],
                        quads,
                        scale_w: &scale[o0..o0 + TILE_CH],
                        sums: &sums[o0 * taps..(o0 + TILE_CH) * taps],
                        bias: &bias[o0..o0 + TILE_CH],
                        residual: residual.map(|r| &r[o0 * hw + y * w + x0..]),
                        out: outp.0.wrapping_add(o0 * hw + y * w + x0),
                        hw,
                        rows: mv,
                        cols: nv,
                    };
                    debug_assert!(args.holds());
                    // SAFETY: the weights were packed for this dot-product route, which the CPU has
                    // (`route`); the tile (nv ≤ the route's pixels) reads inside the planes
                    // (their slack covers a whole tile past any row: `QuadPlanes::new`) and its
                    // weights, scales, sums and biases (sliced whole above); it writes its mv
                    // channels' nv pixels of row y, inside `out`, which no other task writes
                    // (tasks own (row, channel block)).
                    unsafe {
                        match route {
                            #[cfg(target_arch = "x86_64")]
                            Route::Avx512Vnni => avx512vnni::conv_kernel(&args),
                            #[cfg(target_arch = "x86_64")]
                            Route::AvxVnni => avxvnni::conv_kernel(&args),
                            #[cfg(target_arch = "aarch64")]
                            Route::Dotprod => neon::dotprod(&args),
                            #[cfg(target_arch = "aarch64")]
                            Route::I8mm => neon::i8mm(&args),
                            _ => unreachable!("conv int8: weights packed for the {} route, which this CPU lacks", route.name()),
                        }
                    };
                }
            }
        });
        // SAFETY: the tasks above wrote all cout · hw values.
        unsafe { out.set_len(cout * hw) };
        out
    }
}

/// Whether an op of `taps` taps over `cin` channels runs on the int8 tiles at `level`: where
/// the CPU has them, and the i32 sums cannot overflow.
fn on_tiles(level: Isa, cin: usize, taps: usize) -> bool {
    route(level) == Route::Amx && taps * cin <= INT8_MAX_TAPS_CIN
}

/// One register tile of the convolution (see the module's documentation).
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
pub(super) struct ConvTile<'a> {
    pub planes: &'a QuadPlanes,
    /// The padded-plane index of the tile's first pixel at tap (0, 0): output (y, x0) reads
    /// padded (y + dy, x0 + dx).
    pub base: usize,
    /// Each tap's offset from `base` (9 taps, or the centre alone).
    pub offsets: &'a [usize],
    /// [tap][quad][channel of the tile] words.
    pub weights: &'a [i32],
    pub quads: usize,
    /// Per channel of the tile ([`TILE_CH`]), and per channel and tap.
    pub scale_w: &'a [f32],
    pub sums: &'a [f32],
    pub bias: &'a [f32],
    /// The residual at the tile's first output (channel-major, planes `hw` apart).
    pub residual: Option<&'a [f32]>,
    pub out: *mut f32,
    pub hw: usize,
    /// Channels (≤ [`TILE_CH`]) and pixels (≤ the route's tile: [`TILE_PX`], 16 on AVX-VNNI)
    /// kept.
    pub rows: usize,
    pub cols: usize,
}

impl ConvTile<'_> {
    /// Whether the slices hold what the kernel reads.
    pub fn holds(&self) -> bool {
        let taps = self.offsets.len();
        let last = self.base + self.offsets.iter().max().copied().unwrap_or(0) + TILE_PX;
        self.offsets.iter().all(|&o| o <= 2 * self.planes.wp + 2)
            && last <= self.planes.plane
            && self.planes.data.len() >= self.quads * self.planes.plane
            && self.planes.scale.len() >= last
            && self.planes.scale_zero.len() >= last
            && self.weights.len() >= taps * self.quads * TILE_CH
            && self.scale_w.len() >= TILE_CH
            && self.sums.len() >= taps * TILE_CH
            && self.bias.len() >= TILE_CH
            && self.rows <= TILE_CH
            && self.cols <= TILE_PX
            && self.residual.is_none_or(|r| self.rows == 0 || r.len() >= (self.rows - 1) * self.hw + self.cols)
    }
}

/// The input quantised per pixel: quad planes of the padded image, and per padded pixel its
/// scale and scale · zero point.
pub(super) struct QuadPlanes {
    /// quads × `plane` words.
    pub data: Vec<i32>,
    /// Padded width (w + 2); a plane holds (h + 2) rows of it and a tile's worth of slack.
    pub wp: usize,
    pub plane: usize,
    pub scale: Vec<f32>,
    pub scale_zero: Vec<f32>,
    /// Every zero point is 0 (as after a ReLU): the kernel skips their correction.
    #[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
    pub zero_free: bool,
    /// The zero point per padded pixel (for the emulated route's dequantisation).
    zero: Vec<i32>,
}

impl QuadPlanes {
    fn new(x: &[f32], cin: usize, h: usize, w: usize, relu: bool) -> Self {
        let (wp, hp) = (w + 2, h + 2);
        let plane = hp * wp + TILE_PX;
        let quads = cin.div_ceil(4);
        let mut data = vec![0i32; quads * plane];
        let mut scale = vec![1f32; plane];
        let mut zero = vec![0i32; plane];
        let hw = h * w;
        // Rows in parallel: each writes padded row y + 1 of every plane, through raw pointers
        // (the rows are disjoint).
        let (dp, sp, zp) = (
            crate::simd::SendPtr(data.as_mut_ptr() as *mut f32),
            crate::simd::SendPtr(scale.as_mut_ptr()),
            crate::simd::SendPtr(zero.as_mut_ptr() as *mut f32),
        );
        let (dp, sp, zp) = (&dp, &sp, &zp);
        let level = crate::simd::isa::current();
        (0..h).into_par_iter().for_each(|y| {
            let row = (y + 1) * wp + 1;
            // SAFETY: padded row y + 1, columns 1..=w, of the scales, zero points and every
            // plane is this task's alone, inside `plane` (row + w ≤ (h + 1) · wp).
            let (s, z, planes) = unsafe {
                (
                    std::slice::from_raw_parts_mut(sp.0.add(row), w),
                    std::slice::from_raw_parts_mut((zp.0 as *mut i32).add(row), w),
                    (0..quads).map(|q| std::slice::from_raw_parts_mut((dp.0 as *mut i32).add(q * plane + row), w)).collect::<Vec<_>>(),
                )
            };
            let rows: Vec<&[f32]> = (0..cin).map(|c| &x[c * hw + y * w..][..w]).collect();
            quantise_pixels(level, &rows, relu, s, z, planes);
        });
        // The replicate border: columns 0 and w + 1 of each row, then rows 0 and h + 1.
        let border = |v: &mut [i32]| {
            for y in 1..=h {
                v[y * wp] = v[y * wp + 1];
                v[y * wp + w + 1] = v[y * wp + w];
            }
            v.copy_within(wp..2 * wp, 0);
            v.copy_within(h * wp..(h + 1) * wp, (h + 1) * wp);
        };
        if h > 0 && w > 0 {
            data.par_chunks_mut(plane).for_each(border);
            border(&mut zero);
            let mut bits: Vec<i32> = scale.iter().map(|s| s.to_bits() as i32).collect();
            border(&mut bits);
            scale = bits.iter().map(|&b| f32::from_bits(b as u32)).collect();
        }
        let scale_zero = scale.iter().zip(&zero).map(|(s, &z)| s * z as f32).collect();
        let zero_free = zero.iter().all(|&z| z == 0);
        Self { data, wp, plane, scale, scale_zero, zero_free, zero }
    }

    /// The input as the products see it: (cin, h, w) f32, each value (u − z) · s.
    fn dequantised(&self, cin: usize, h: usize, w: usize) -> Vec<f32> {
        let mut x = vec![0f32; cin * h * w];
        if x.is_empty() {
            return x;
        }
        x.par_chunks_mut(h * w).enumerate().for_each(|(c, xc)| {
            let (quad, j) = (c / 4, c % 4);
            for y in 0..h {
                for xx in 0..w {
                    let p = (y + 1) * self.wp + xx + 1;
                    let u = (self.data[quad * self.plane + p] >> (8 * j)) & 0xff;
                    xc[y * w + xx] = (u - self.zero[p]) as f32 * self.scale[p];
                }
            }
        });
        x
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512vnni;
#[cfg(target_arch = "x86_64")]
mod avxvnni;
#[cfg(target_arch = "aarch64")]
mod neon;

/// [`QuantConv`] as a candle op: conv(relu?(x)) [+ residual] (an upsampling or transposed op
/// takes no ReLU: [`QuantConv::run`]).
pub struct QuantConvCall<'a> {
    op: &'a QuantConv,
    relu_input: bool,
}

impl QuantConvCall<'_> {
    fn dims(&self, l: &candle_core::Layout) -> candle_core::Result<(usize, usize)> {
        let (c, h, w) = l.shape().dims3()?;
        if c != self.op.cin {
            candle_core::bail!("conv int8: input has {c} channels, weight expects {}", self.op.cin);
        }
        Ok((h, w))
    }
}

impl candle_core::CustomOp1 for QuantConvCall<'_> {
    fn name(&self) -> &'static str {
        "conv-int8"
    }
    fn cpu_fwd(&self, s: &candle_core::CpuStorage, l: &candle_core::Layout) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let (h, w) = self.dims(l)?;
        let x = contiguous(s, l, "conv int8")?;
        let y = self.op.run(x, h, w, self.relu_input, None)?;
        Ok((candle_core::CpuStorage::F32(y), candle_core::Shape::from(self.op.out_dims(h, w))))
    }
}

impl candle_core::CustomOp2 for QuantConvCall<'_> {
    fn name(&self) -> &'static str {
        "conv-int8-add"
    }
    fn cpu_fwd(
        &self,
        s1: &candle_core::CpuStorage,
        l1: &candle_core::Layout,
        s2: &candle_core::CpuStorage,
        l2: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let (h, w) = self.dims(l1)?;
        let (oc, oh, ow) = self.op.out_dims(h, w);
        if l2.shape().dims() != [oc, oh, ow] {
            candle_core::bail!("conv int8: residual {:?} does not match the output ({oc}, {oh}, {ow})", l2.shape());
        }
        let x = contiguous(s1, l1, "conv int8")?;
        let r = contiguous(s2, l2, "conv int8 residual")?;
        let y = self.op.run(x, h, w, self.relu_input, Some(r))?;
        Ok((candle_core::CpuStorage::F32(y), candle_core::Shape::from((oc, oh, ow))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{isa, test_values};

    /// The int8 maths in f64 from the quantised operands (replicate padding), and the f32
    /// convolution's, for one shape, at every level; the dot-product routes' outputs bit for bit
    /// alike (VNNI's on x86-64, `sdot`'s and `usdot`'s on aarch64).
    /// (The AVX-VNNI kernel runs at the avx2 level only where the CPU has AVX-VNNI: not on an
    /// AVX512-VNNI Xeon before Sapphire Rapids, where that level is emulated.)
    fn check(cin: usize, cout: usize, h: usize, w: usize, relu: bool, residual: bool, seed: &mut u64) {
        let x = test_values(seed, cin * h * w);
        let wt = test_values(seed, cout * cin * 9);
        let bias = test_values(seed, cout);
        let res = residual.then(|| test_values(seed, cout * h * w));
        let (sw, q) = quantise_weights(&wt, cout, cin * 9);
        let planes = QuadPlanes::new(&x, cin, h, w, relu);
        let xq = planes.dequantised(cin, h, w);
        let clamp = |v: isize, n: usize| v.clamp(0, n as isize - 1) as usize;
        let mut want = vec![0f64; cout * h * w];
        let mut exact = vec![0f64; cout * h * w];
        for o in 0..cout {
            for y in 0..h {
                for xx in 0..w {
                    let (mut s, mut e) = (0f64, 0f64);
                    for c in 0..cin {
                        for t in 0..9 {
                            let (iy, ix) = (clamp(y as isize + t as isize / 3 - 1, h), clamp(xx as isize + t as isize % 3 - 1, w));
                            s += xq[(c * h + iy) * w + ix] as f64 * q[(o * cin + c) * 9 + t] as f64 * sw[o] as f64;
                            let v = x[(c * h + iy) * w + ix];
                            e += if relu { v.max(0.0) } else { v } as f64 * wt[(o * cin + c) * 9 + t] as f64;
                        }
                    }
                    let r = res.as_ref().map_or(0.0, |r| r[(o * h + y) * w + xx] as f64) + bias[o] as f64;
                    want[(o * h + y) * w + xx] = s + r;
                    exact[(o * h + y) * w + xx] = e + r;
                }
            }
        }
        // The dot-product routes' outputs, which must agree bit for bit.
        let mut native: Vec<(Isa, Vec<u32>)> = Vec::new();
        for level in isa::levels() {
            let op = QuantConv::new(&wt, bias.clone(), cin, cout, level).unwrap();
            let got = isa::with_isa(level, || op.run(&x, h, w, relu, res.as_deref())).unwrap();
            let mag = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
            // The tiles quantise per band (their numbers: `super::tiles`'s tests): here near f32.
            assert_eq!(op.on_tiles(), route(level) == Route::Amx, "{level}");
            if op.on_tiles() {
                let off = got.iter().zip(&exact).fold(0f64, |m, (&g, e)| m.max((g as f64 - e).abs()));
                assert!(off <= 0.05 * mag, "{level} tiles {cin}->{cout} {h}x{w}: off f32 by {off} of {mag}");
                continue;
            }
            // Every dot-product route runs its kernel, not the emulation.
            let dot = matches!(route(level), Route::Avx512Vnni | Route::AvxVnni | Route::Dotprod | Route::I8mm);
            assert_eq!(op.native(), dot, "{level}: route {}", route(level).name());
            if op.native() {
                native.push((level, got.iter().map(|v| v.to_bits()).collect()));
            }
            let spread = exact.iter().zip(&want).fold(0f64, |m, (e, v)| m.max((e - v).abs()));
            for (i, (&g, &v)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g as f64 - v).abs() <= 2e-6 * mag * ((9 * cin) as f64).sqrt(),
                    "{level} native {} {cin}->{cout} {h}x{w} relu {relu} [{i}]: {g} vs {v}",
                    op.native()
                );
            }
            // The quantisation's own error is small beside the values.
            assert!(spread <= 0.05 * mag, "{cin}->{cout}: int8 off f32 by {spread} of {mag}");
        }
        for pair in native.windows(2) {
            assert!(pair[0].1 == pair[1].1, "{cin}->{cout} {h}x{w}: the {} and {} routes differ", pair[0].0, pair[1].0);
        }
    }

    /// The upsampling convolution against conv3x3(upsample_bilinear_2x(x)) in f64, computed
    /// the plain way (the upsampled map, then replicate padding), and against the int8 maths of
    /// its quantised operands (x per pixel before the upsample, the phases' kernels per channel).
    fn check_upsampled(cin: usize, cout: usize, h: usize, w: usize, residual: bool, seed: &mut u64) {
        let x = test_values(seed, cin * h * w);
        let wt = test_values(seed, cout * cin * 9);
        let bias = test_values(seed, cout);
        let (oh, ow) = (2 * h, 2 * w);
        let res = residual.then(|| test_values(seed, cout * oh * ow));
        let clamp = |v: isize, n: usize| v.clamp(0, n as isize - 1) as usize;
        // Upsampled index i of n: the two inputs and their weights (align_corners=False at 2x).
        let taps = |i: usize, n: usize| {
            let m = (i / 2) as isize;
            if i.is_multiple_of(2) {
                [(clamp(m - 1, n), 0.25), (clamp(m, n), 0.75)]
            } else {
                [(clamp(m, n), 0.75), (clamp(m + 1, n), 0.25)]
            }
        };
        let mut up = vec![0f64; cin * oh * ow];
        for c in 0..cin {
            for y in 0..oh {
                for xx in 0..ow {
                    let mut v = 0f64;
                    for (iy, ay) in taps(y, h) {
                        for (ix, ax) in taps(xx, w) {
                            v += ay * ax * x[(c * h + iy) * w + ix] as f64;
                        }
                    }
                    up[(c * oh + y) * ow + xx] = v;
                }
            }
        }
        let r = |o: usize, y: usize, xx: usize| res.as_ref().map_or(0.0, |r| r[(o * oh + y) * ow + xx] as f64) + bias[o] as f64;
        let mut exact = vec![0f64; cout * oh * ow];
        for o in 0..cout {
            for y in 0..oh {
                for xx in 0..ow {
                    let mut e = r(o, y, xx);
                    for c in 0..cin {
                        for t in 0..9 {
                            let (iy, ix) = (clamp(y as isize + t as isize / 3 - 1, oh), clamp(xx as isize + t as isize % 3 - 1, ow));
                            e += up[(c * oh + iy) * ow + ix] * wt[(o * cin + c) * 9 + t] as f64;
                        }
                    }
                    exact[(o * oh + y) * ow + xx] = e;
                }
            }
        }
        // The int8 maths: phase (py, px) of output (2i + py, 2j + px) at input pixel (i, j).
        let phased = crate::model::cpu::conv3x3::phased_weights(&wt, cin, cout);
        let (sw, q) = quantise_weights(&phased, 4 * cout, cin * 9);
        let xq = QuadPlanes::new(&x, cin, h, w, false).dequantised(cin, h, w);
        let mut want = vec![0f64; cout * oh * ow];
        for o in 0..cout {
            for y in 0..oh {
                for xx in 0..ow {
                    let (i, j, ph) = (y / 2, xx / 2, (y % 2) * 2 + xx % 2);
                    let po = ph * cout + o;
                    let mut s = 0f64;
                    for c in 0..cin {
                        for t in 0..9 {
                            let (iy, ix) = (clamp(i as isize + t as isize / 3 - 1, h), clamp(j as isize + t as isize % 3 - 1, w));
                            s += xq[(c * h + iy) * w + ix] as f64 * q[(po * cin + c) * 9 + t] as f64 * sw[po] as f64;
                        }
                    }
                    want[(o * oh + y) * ow + xx] = s + r(o, y, xx);
                }
            }
        }
        let mag = exact.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        let spread = exact.iter().zip(&want).fold(0f64, |m, (e, v)| m.max((e - v).abs()));
        assert!(spread <= 0.05 * mag, "upsampled {cin}->{cout}: int8 off the f64 upsample + conv by {spread} of {mag}");
        for level in isa::levels() {
            let op = QuantConv::new_upsampling(&wt, bias.clone(), cin, cout, level).unwrap();
            assert!(op.upsampling());
            let got = isa::with_isa(level, || op.run(&x, h, w, false, res.as_deref())).unwrap();
            assert_eq!(got.len(), cout * oh * ow);
            if op.on_tiles() {
                let off = got.iter().zip(&exact).fold(0f64, |m, (&g, e)| m.max((g as f64 - e).abs()));
                assert!(off <= 0.05 * mag, "{level} tiles upsampled {cin}->{cout}: off by {off} of {mag}");
                continue;
            }
            for (i, (&g, &v)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g as f64 - v).abs() <= 2e-6 * mag * ((9 * cin) as f64).sqrt(),
                    "{level} native {} upsampled {cin}->{cout} {h}x{w} [{i}]: {g} vs {v}",
                    op.native()
                );
            }
        }
    }

    #[test]
    fn upsampling_routes_match_the_upsample_then_conv() {
        let mut seed = 0x0b5e_55ed_1e55_c0deu64;
        for (cin, cout, h, w, residual) in [(1, 1, 1, 1, false), (5, 3, 2, 9, true), (36, 8, 4, 19, false), (64, 32, 3, 17, true)] {
            check_upsampled(cin, cout, h, w, residual, &mut seed);
        }
    }

    /// The 1x1 convolution (with a residual where asked) and the 2x2 stride-2 transposed one,
    /// against their int8 maths in f64 from the quantised operands (x per pixel, the weights per
    /// output channel: per phase and channel for the transposed one), and against the f32
    /// operands. `wt` is (cout, cin) for the 1x1 one, (cout·4, cin) with row o·4 + di·2 + dj for
    /// the transposed one (as `ConvTranspose2x2` holds it).
    #[allow(clippy::too_many_arguments)]
    fn check_pointwise(cin: usize, cout: usize, h: usize, w: usize, transposed: bool, relu: bool, residual: bool, seed: &mut u64) {
        let phases = if transposed { 4 } else { 1 };
        let x = test_values(seed, cin * h * w);
        let wt = test_values(seed, phases * cout * cin);
        let bias = test_values(seed, cout);
        let (oh, ow) = if transposed { (2 * h, 2 * w) } else { (h, w) };
        let res = residual.then(|| test_values(seed, cout * oh * ow));
        // Row of `wt` for output channel o at phase ph, and the row it is quantised as.
        let row = |o: usize, ph: usize| if transposed { o * 4 + ph } else { o };
        let qrow = |o: usize, ph: usize| if transposed { ph * cout + o } else { o };
        let mut reordered = vec![0f32; phases * cout * cin];
        for o in 0..cout {
            for ph in 0..phases {
                reordered[qrow(o, ph) * cin..][..cin].copy_from_slice(&wt[row(o, ph) * cin..][..cin]);
            }
        }
        let (sw, q) = quantise_weights(&reordered, phases * cout, cin);
        let xq = QuadPlanes::new(&x, cin, h, w, relu).dequantised(cin, h, w);
        let (mut want, mut exact) = (vec![0f64; cout * oh * ow], vec![0f64; cout * oh * ow]);
        for o in 0..cout {
            for y in 0..oh {
                for xx in 0..ow {
                    let (i, j, ph) = if transposed { (y / 2, xx / 2, (y % 2) * 2 + xx % 2) } else { (y, xx, 0) };
                    let r = res.as_ref().map_or(0.0, |r| r[(o * oh + y) * ow + xx] as f64) + bias[o] as f64;
                    let (mut s, mut e) = (r, r);
                    for c in 0..cin {
                        let k = qrow(o, ph);
                        s += xq[(c * h + i) * w + j] as f64 * q[k * cin + c] as f64 * sw[k] as f64;
                        let v = x[(c * h + i) * w + j];
                        e += if relu { v.max(0.0) } else { v } as f64 * wt[row(o, ph) * cin + c] as f64;
                    }
                    want[(o * oh + y) * ow + xx] = s;
                    exact[(o * oh + y) * ow + xx] = e;
                }
            }
        }
        let mag = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        let spread = exact.iter().zip(&want).fold(0f64, |m, (e, v)| m.max((e - v).abs()));
        assert!(spread <= 0.05 * mag, "{cin}->{cout} transposed {transposed}: int8 off f32 by {spread} of {mag}");
        for level in isa::levels() {
            let new = if transposed { QuantConv::new_transposed } else { QuantConv::new_pointwise };
            let op = new(&wt, bias.clone(), cin, cout, level).unwrap();
            assert_eq!(op.upsampling(), transposed);
            let got = isa::with_isa(level, || op.run(&x, h, w, relu, res.as_deref())).unwrap();
            assert_eq!(got.len(), cout * oh * ow);
            // (The one-tap tiles quantise per pixel too: the same numbers.)
            for (i, (&g, &v)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g as f64 - v).abs() <= 2e-6 * mag * (cin as f64).sqrt(),
                    "{level} native {} {cin}->{cout} {h}x{w} transposed {transposed} [{i}]: {g} vs {v}",
                    op.native()
                );
            }
        }
    }

    #[test]
    fn pointwise_and_transposed_routes_match_the_int8_reference() {
        let mut seed = 0x7a11_0f1c_e5ca_1ab1u64;
        for (cin, cout, h, w, transposed, relu, residual) in [
            (1, 1, 1, 1, false, false, false),
            (5, 7, 3, 19, false, false, true),
            (64, 13, 2, 37, false, true, false),
            (3, 2, 1, 1, true, false, false),
            (33, 10, 3, 17, true, false, true),
            (64, 32, 2, 40, true, false, false),
        ] {
            check_pointwise(cin, cout, h, w, transposed, relu, residual, &mut seed);
        }
    }

    /// Inputs or residuals shorter than the shape says are an error, not a read past them.
    #[test]
    fn short_operands_are_refused() {
        let op = QuantConv::new(&[0.5; 4 * 2 * 9], vec![0.0; 4], 2, 4, isa::max()).unwrap();
        assert!(op.run(&[1.0; 2 * 3 * 5], 3, 5, false, None).is_ok());
        assert!(op.run(&[1.0; 2 * 3 * 5 - 1], 3, 5, false, None).is_err());
        assert!(op.run(&[1.0; 2 * 3 * 5], 3, 5, true, Some(&[0.0; 4 * 3 * 5 - 1])).is_err());
        // Upsampling and transposed ops: the residual at the output's size (4x the input's),
        // no ReLU on their input, whole weights.
        let up = QuantConv::new_upsampling(&[0.5; 4 * 2 * 9], vec![0.0; 4], 2, 4, isa::max()).unwrap();
        let tr = QuantConv::new_transposed(&[0.5; 4 * 4 * 2], vec![0.0; 4], 2, 4, isa::max()).unwrap();
        for op in [&up, &tr] {
            assert_eq!(op.run(&[1.0; 2 * 3 * 5], 3, 5, false, Some(&[0.0; 4 * 6 * 10])).unwrap().len(), 4 * 6 * 10);
            assert!(op.run(&[1.0; 2 * 3 * 5], 3, 5, false, Some(&[0.0; 4 * 3 * 5])).is_err());
            assert!(op.run(&[1.0; 2 * 3 * 5], 3, 5, true, None).is_err());
        }
        assert!(QuantConv::new_transposed(&[0.5; 4 * 4 * 2 - 1], vec![0.0; 4], 2, 4, isa::max()).is_err());
        assert!(QuantConv::new_pointwise(&[0.5; 8], vec![0.0; 3], 2, 4, isa::max()).is_err());
    }

    /// The per-pixel quantiser gives the portable body's scales, zero points and bytes at every
    /// level, bit for bit, on edge values (NaN, infinities, signed zeros, huge and tiny values,
    /// all-zero pixels), with and without the ReLU, at widths around the vector width and
    /// channel counts that leave a quad part-filled.
    #[test]
    fn the_pixel_quantiser_is_the_same_at_every_level() {
        let mut seed = 0x5e1e_c7ed_0dd5_4a11u64;
        let edge = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0, 1e30, -1e30, 1e-30, 3.5, -2.5, 254.5, 0.5];
        for (cin, w) in [(1, 1), (3, 15), (4, 16), (6, 17), (9, 33), (32, 40)] {
            let mut x = test_values(&mut seed, cin * w);
            for (i, v) in x.iter_mut().enumerate() {
                // Scaled up (several scales per pixel), some values replaced by the edge ones.
                *v *= [1.0, 1e3, 1e-3][i % 3];
                if i % 7 == 3 {
                    *v = edge[(i / 7) % edge.len()];
                }
            }
            // A pixel of zeros in every channel (the range is empty: scale 1), and one of values
            // near the smallest normal (a subnormal scale, an infinite inverse).
            for c in 0..cin {
                x[c * w] = 0.0;
                if w > 1 {
                    x[c * w + w - 1] = [1e-38, -3e-38, 2e-39][c % 3];
                }
            }
            let rows: Vec<&[f32]> = x.chunks(w).collect();
            for relu in [false, true] {
                // Outputs with a vector's worth of sentinels past w, which must stay untouched.
                let run = |level: Isa| {
                    let (mut s, mut z) = (vec![-7f32; w + 16], vec![-7i32; w + 16]);
                    let mut planes = vec![vec![-7i32; w + 16]; cin.div_ceil(4)];
                    quantise_pixels(level, &rows, relu, &mut s[..w], &mut z[..w], planes.iter_mut().map(|p| &mut p[..w]).collect());
                    assert!(s[w..].iter().all(|&v| v == -7.0) && z[w..].iter().all(|&v| v == -7), "{level}: written past w");
                    assert!(planes.iter().all(|p| p[w..].iter().all(|&v| v == -7)), "{level}: a plane written past w");
                    (s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), z, planes)
                };
                let want = run(Isa::Portable);
                for level in isa::levels() {
                    assert_eq!(run(level), want, "{level} cin {cin} w {w} relu {relu}");
                }
            }
        }
    }

    #[test]
    fn every_route_matches_the_int8_reference() {
        let mut seed = 0x1f83_d9ab_fb41_bd6bu64;
        for (cin, cout, h, w, relu, residual) in [
            (1, 1, 1, 1, false, false),
            (4, 6, 3, 5, true, false),
            (7, 13, 4, 37, false, true),
            (32, 40, 5, 33, true, true),
            (64, 7, 2, 70, true, false),
            (5, 3, 1, 9, false, false),
        ] {
            check(cin, cout, h, w, relu, residual, &mut seed);
        }
    }
}
