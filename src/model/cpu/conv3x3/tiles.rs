//! The 3x3 convolution on AMX tiles, in bf16 or int8, direct (an implicit GEMM over the padded
//! map): the input converted once per call, not once per tap as im2col's nine copies are.
//!
//! Per task, a band of output rows, and a slab of three input rows that rolls down the band:
//! before output row y, input row y + 1 (edges replicated, after the ReLU when asked) replaces
//! row y − 2, so each input row is converted once per band. A slab row holds bf16 pairs of
//! channels, plane by plane: for each horizontal tap kx a copy shifted by kx − 1, so that every
//! tile row the kernel loads starts on a cache line (a load across lines runs 6x slower,
//! `examples/amx_peak.rs`). Then per output
//! row, 32 pixels and 32 output channels at a time, four accumulator tiles over 9 taps × the
//! channel pairs: A = the tap's weights (16 output channels × 16 channel pairs, one row per
//! channel), B = 16 channel pairs × 16 pixels of one shifted row (one plane per tile row), C =
//! output channels × pixels, the planar output's own orientation. Written on any
//! [`TileUnit`]: the hardware's on the `amx` level, the emulation's in every machine's tests.
//! The same loops with one tap and four phases run the decoder's transposed 2x2 convolutions
//! ([`TileConv::new_transposed`]).
//!
//! In int8 ([`Kind::Int8`]) a word is a quad of channels instead of a pair: s8 weights per
//! output channel (as the linears'), the slab's u8 with one scale and zero point per band
//! (`tdpbsud`, i32 sums). Not per pixel, as the VNNI kernel's (`super::int8`): every tap of an
//! output pixel reads other pixels, and the tiles sum the taps before anything can scale them.
//! The zero point's share, z · Σ q over the taps and channels, is one number per output
//! channel, since the replicated edges give every tap a pixel.

use rayon::prelude::*;

use crate::model::cpu::matmul::bf16::pair;
use crate::model::cpu::matmul::int8::{quantise_weights, range, range_scale};
use crate::simd::isa::Isa;
use crate::simd::tiles::{TileUnit, ROWS};
use crate::simd::{Lines, MatMut, SendPtr};

/// Output channels and pixels per group: two tiles of 16 each way.
const G: usize = 2 * ROWS;
/// Words from one channel pair's plane of a slab to the next (`rows` rows of `wp`): an odd
/// number of cache lines. A B tile's 16 rows are 16 planes' rows: at a power of two apart (64
/// KiB at 32 channels) they fell in one L1 set of 12 ways, and every tile load missed.
fn plane_words(rows: usize, wp: usize) -> usize {
    ((rows * wp).div_ceil(16) | 1) * 16
}

thread_local! {
    /// A thread's slab, kept between bands and calls (a fresh one per task zeroed 1 MiB).
    static SLAB: std::cell::RefCell<Lines<u32>> = std::cell::RefCell::new(Lines::zeros(0));
}

/// Rows of a slab: the three that one output row's taps read. Before, a band's slab held all
/// its input rows (a band as tall as ~1 MiB of slab allowed: 3-4 rows at 64-256 channels), so
/// every band converted its two edge rows again, 5 rows for 3; and the side copies were the
/// centre's shifted by `memmove` (4 % of a ViT-S forward). Now each row once per band, its
/// three copies in one pass (`super::pairs3`): 64 channels at 280x416 4.24-4.30 -> 3.93-3.97
/// ms, 128 at 140x208 with the residual 4.23-4.55 -> 3.90-3.96 ms (an Intel Xeon with AMX,
/// 2 threads, 2026-12-07).
const RING: usize = 3;

/// Tasks per thread: bands of h / (threads · BANDS_PER_THREAD) rows, each converting two rows
/// twice (its first output row's neighbours).
const BANDS_PER_THREAD: usize = 3;

/// What the tiles multiply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// bf16 pairs of channels into f32 (`tdpbf16ps`).
    Bf16,
    /// s8 quads of channels (the weights) by u8 quads (the slab) into i32 (`tdpbsud`).
    Int8,
}

/// The largest `taps · cin` of an int8 op: its sums, up to taps · cin · 255 · 127, stay within
/// an i32.
pub const INT8_MAX_TAPS_CIN: usize = (i32::MAX / (255 * 127)) as usize;

/// An int8 op's numbers beside its words, per tile channel (`coutp`, zero past cout).
struct Int8 {
    /// s_w, the weights' scale.
    scale: Vec<f32>,
    /// Σ q over the taps and input channels (the zero point's share is z times it).
    sums: Vec<i32>,
}

/// A 3x3 convolution's weights as the tiles read them: per tap, per output channel (padded to
/// whole groups of 32 with zeros), its channel words (pairs in bf16, quads in int8; padded to
/// whole tiles' 16 with zeros).
pub struct TileConv {
    cin: usize,
    cout: usize,
    /// 9 (a 3x3 convolution), or 1: with `phases_of`, a transposed 2x2 one of stride 2
    /// ([`TileConv::new_transposed`]), whose slab holds the centre tap's copy alone.
    taps: usize,
    /// Channel words per row (pairs, or quads in int8), a multiple of 16.
    cw: usize,
    /// In int8: the weights' scales and sums.
    int8: Option<Int8>,
    /// Output channels stored, a multiple of 32.
    coutp: usize,
    /// `[tap][output channel][channel word]` (`taps` taps), on a cache line.
    words: Lines<u32>,
    /// Run on the tiles' emulation (tests) instead of the hardware.
    emulated: bool,
    /// For the convolution after a 2x bilinear upsample ([`TileConv::new_upsampling`]) and the
    /// transposed one ([`TileConv::new_transposed`]): its own output channels (the tiles' are
    /// its four phases').
    phases_of: Option<usize>,
}

/// The tiles' output channel n of an upsampling op with `nb` blocks of 16 output channels:
/// (py, px, o). Groups of 32 hold one output row's phases px = 0 (rows 0..16) and px = 1 (rows
/// 16..32) of the same 16 channels, so that a group's epilogue interleaves them into whole
/// output rows.
fn phase_channel(n: usize, nb: usize) -> (usize, usize, usize) {
    let (q, within) = (n / G, n % G);
    (q / nb, within / ROWS, (q % nb) * ROWS + within % ROWS)
}

/// A group whose tiles were stored to an accumulator buffer and whose epilogue is still to
/// run: output row `y`, pixels from `x0` (nv of them), tile channels from `o0` (mv).
#[derive(Clone, Copy)]
struct Pending {
    acc: usize,
    y: usize,
    x0: usize,
    nv: usize,
    o0: usize,
    mv: usize,
}

impl TileConv {
    /// From PyTorch's (cout, cin, 3, 3) weight, for the hardware, or its emulation (`emulated`).
    pub fn new(w: &[f32], cin: usize, cout: usize, kind: Kind, emulated: bool) -> Self {
        Self::with_taps(w, cin, cout, 9, kind, emulated)
    }

    /// `nn.ConvTranspose2d(cin, cout, 2, stride=2)` from its weight as (cout·4, cin) with rows
    /// (o, di, dj): each output pixel (2i + di, 2j + dj) is a 1x1 product of input pixel (i,
    /// j), so it is the four phases (di, dj) of a one-tap op, interleaved by the epilogue as an
    /// upsampling op's ([`TileConv::run_upsampled`]). Before, a product into a zeroed (4·cout,
    /// h·w) buffer then a pass to interleave it.
    pub fn new_transposed(w: &[f32], cin: usize, cout: usize, kind: Kind, emulated: bool) -> Self {
        assert!(w.len() >= 4 * cout * cin, "conv-transpose tiles: a weight of {} for {cout}x{cin}x2x2", w.len());
        let nb = cout.div_ceil(ROWS);
        let mut ordered = vec![0f32; 4 * nb * ROWS * cin];
        for (n, dst) in ordered.chunks_exact_mut(cin.max(1)).enumerate() {
            let (py, px, o) = phase_channel(n, nb);
            if o < cout {
                dst.copy_from_slice(&w[(o * 4 + py * 2 + px) * cin..][..cin]);
            }
        }
        let mut conv = Self::with_taps(&ordered, cin, 4 * nb * ROWS, 1, kind, emulated);
        conv.phases_of = Some(cout);
        conv
    }

    /// `nn.Conv2d(cin, cout, 1)` from its (cout, cin) weight: one tap, the centre's.
    pub fn new_pointwise(w: &[f32], cin: usize, cout: usize, kind: Kind, emulated: bool) -> Self {
        Self::with_taps(w, cin, cout, 1, kind, emulated)
    }

    /// From a (cout, cin, taps) weight, `taps` 9 or 1 (in int8 at most
    /// [`INT8_MAX_TAPS_CIN`] of `taps · cin`).
    fn with_taps(w: &[f32], cin: usize, cout: usize, taps: usize, kind: Kind, emulated: bool) -> Self {
        assert!(taps == 9 || taps == 1, "conv3x3 tiles: {taps} taps");
        assert!(w.len() >= cout * cin * taps, "conv3x3 tiles: a weight of {} for {cout}x{cin}x{taps}", w.len());
        let per_word = if kind == Kind::Int8 { 4 } else { 2 };
        let cw = cin.div_ceil(per_word * ROWS) * ROWS;
        let coutp = cout.next_multiple_of(G);
        let mut words = Lines::<u32>::zeros(taps * coutp * cw);
        let int8 = match kind {
            Kind::Bf16 => {
                let at = |o: usize, c: usize, t: usize| if c < cin { w[(o * cin + c) * taps + t] } else { 0.0 };
                for t in 0..taps {
                    for o in 0..cout {
                        for cp in 0..cin.div_ceil(2) {
                            words[(t * coutp + o) * cw + cp] = pair(at(o, 2 * cp, t), at(o, 2 * cp + 1, t));
                        }
                    }
                }
                None
            }
            Kind::Int8 => {
                assert!(taps * cin <= INT8_MAX_TAPS_CIN, "conv3x3 tiles: {taps} taps of {cin} channels overflow int8's sums");
                let k = cin * taps;
                let (mut scale, q) = quantise_weights(&w[..cout * k], cout, k);
                let at = |o: usize, c: usize, t: usize| if c < cin { q[(o * cin + c) * taps + t] as u8 } else { 0 };
                for t in 0..taps {
                    for o in 0..cout {
                        for cq in 0..cin.div_ceil(4) {
                            let c = 4 * cq;
                            words[(t * coutp + o) * cw + cq] = u32::from_le_bytes([at(o, c, t), at(o, c + 1, t), at(o, c + 2, t), at(o, c + 3, t)]);
                        }
                    }
                }
                let mut sums: Vec<i32> = (0..cout).map(|o| q[o * k..][..k].iter().map(|&v| v as i32).sum()).collect();
                scale.resize(coutp, 0.0);
                sums.resize(coutp, 0);
                Some(Int8 { scale, sums })
            }
        };
        TileConv { cin, cout, taps, cw, int8, coutp, words, emulated, phases_of: None }
    }

    /// What the op multiplies.
    pub fn kind(&self) -> Kind {
        if self.int8.is_some() {
            Kind::Int8
        } else {
            Kind::Bf16
        }
    }

    /// The slab's copies of each row: one per horizontal tap (9 taps), or the centre's alone.
    fn copies(&self) -> usize {
        if self.taps == 9 {
            3
        } else {
            1
        }
    }

    /// For conv3x3(upsample_bilinear_2x(x)) from the (cout, cin, 3, 3) weight of the
    /// convolution after the upsample: the four phases' kernels (`super::phased_weights`) as
    /// 4 · cout rounded up to 16 channels in [`phase_channel`]'s order (zeros past cout).
    pub fn new_upsampling(w: &[f32], cin: usize, cout: usize, kind: Kind, emulated: bool) -> Self {
        let phased = super::phased_weights(w, cin, cout);
        let nb = cout.div_ceil(ROWS);
        let k = cin * 9;
        let mut ordered = vec![0f32; 4 * nb * ROWS * k];
        for (n, dst) in ordered.chunks_exact_mut(k.max(1)).enumerate() {
            let (py, px, o) = phase_channel(n, nb);
            if o < cout {
                dst.copy_from_slice(&phased[((py * 2 + px) * cout + o) * k..][..k]);
            }
        }
        let mut conv = TileConv::new(&ordered, cin, 4 * nb * ROWS, kind, emulated);
        conv.phases_of = Some(cout);
        conv
    }

    /// [`TileConv::new_upsampling`]'s op: out (cout, 2h, 2w) = bias + conv3x3(upsample(x))
    /// [+ residual (cout, 2h, 2w)], x (cin, h, w); [`TileConv::new_transposed`]'s: bias +
    /// the transposed convolution of x.
    pub fn run_upsampled(&self, x: &[f32], (h, w): (usize, usize), bias: &[f32], residual: Option<&[f32]>) -> Vec<f32> {
        assert!(self.phases_of.is_some(), "conv3x3 tiles: an upsampled call of a plain op");
        self.run(x, (h, w), false, bias, residual)
    }

    /// out (cout, h, w) = bias + W * relu?(x) [+ residual], x (cin, h, w), edges replicated
    /// (an upsampling op's: [`TileConv::run_upsampled`]).
    pub fn run(&self, x: &[f32], (h, w): (usize, usize), relu: bool, bias: &[f32], residual: Option<&[f32]>) -> Vec<f32> {
        let rows = h.div_ceil(rayon::current_num_threads() * BANDS_PER_THREAD).max(1);
        self.run_bands(x, (h, w), relu, bias, residual, rows)
    }

    /// [`TileConv::run`] in bands of `band` output rows (tests: bands of every size).
    fn run_bands(&self, x: &[f32], (h, w): (usize, usize), relu: bool, bias: &[f32], residual: Option<&[f32]>, band: usize) -> Vec<f32> {
        // Bands of no rows would leave the output unwritten.
        let band = band.max(1);
        let (cin, hw) = (self.cin, h * w);
        // The output's channels and pixels: an upsampling op's are its own, at 4x the pixels.
        let (cout, ohw) = match self.phases_of {
            Some(c) => (c, 4 * hw),
            None => (self.cout, hw),
        };
        assert!(x.len() >= cin * hw && bias.len() >= cout && residual.is_none_or(|r| r.len() >= cout * ohw), "conv3x3 tiles: shapes");
        // Not zeroed: the bands write every element (`band`), on both threads.
        let mut out: Vec<f32> = Vec::with_capacity(cout * ohw);
        if hw == 0 || cout == 0 {
            return out;
        }
        let out_ptr = SendPtr(out.as_mut_ptr());
        let bands: Vec<usize> = (0..h).step_by(band.max(1)).collect();
        bands.par_iter().for_each(|&y0| {
            crate::simd::with_local(&SLAB, |slab| {
                let y1 = (y0 + band).min(h);
                let wp = w.next_multiple_of(G);
                let len = self.copies() * self.cw * plane_words(RING, wp);
                if slab.len() < len {
                    *slab = Lines::zeros(len);
                }
                let slab = &mut slab[..len];
                // SAFETY: rows y0..y1 of every output plane (2y0..2y1 of an upsampling op's)
                // are this band's alone.
                let out = MatMut::from_mut_ptr(out_ptr.get(), cout, ohw, ohw);
                #[cfg(target_arch = "x86_64")]
                if !self.emulated {
                    let mut unit = crate::simd::amx::Amx::new().expect("conv3x3 tiles on a CPU without usable AMX");
                    // SAFETY: the slab is this op's size, the weights are this op's, and the
                    // band's output rows are in `out` and this task's.
                    unsafe { self.band(&mut unit, x, slab, (h, w), relu, (y0, y1), bias, residual, out) };
                    return;
                }
                // SAFETY: as above.
                unsafe { self.band(&mut crate::simd::tiles::Emulated::default(), x, slab, (h, w), relu, (y0, y1), bias, residual, out) };
            })
        });
        // SAFETY: the bands cover rows 0..h, and `band` writes each of their rows' pixels of
        // every output plane (both output rows of each, every column, upsampled): all
        // cout · ohw floats of the capacity.
        unsafe { out.set_len(cout * ohw) };
        out
    }

    /// The vector code the slab's conversions take: AVX512-BF16 (with AVX-512) on the hardware,
    /// none on the emulation.
    fn isa(&self) -> Isa {
        if self.emulated {
            Isa::Portable
        } else {
            crate::simd::isa::usable(Isa::Avx512Bf16)
        }
    }

    /// An int8 op's quantisation of the slab for output rows y0..y1: the scale, its inverse and
    /// the zero point of the range of the input rows they read (after the ReLU).
    fn band_quantisation(&self, x: &[f32], (h, w): (usize, usize), relu: bool, (y0, y1): (usize, usize)) -> (f32, f32, i32) {
        let (r0, r1) = if self.taps == 9 { (y0.saturating_sub(1), (y1 + 1).min(h)) } else { (y0, y1) };
        let (mut lo, mut hi) = (0f32, 0f32);
        for c in 0..self.cin {
            // Rows r0..r1 of channel c, one run of memory.
            let (l, u) = range(self.isa(), &x[(c * h + r0) * w..(c * h + r1) * w]);
            (lo, hi) = (lo.min(l), hi.max(u));
        }
        range_scale(if relu { 0.0 } else { lo }, hi)
    }

    /// Slab row `r` (of the rolling three, slot r mod 3) = input row r − 1 (clamped: replicated
    /// edges): for kx in 0..copies, channel word cp, column c: the pair of channels 2cp, 2cp + 1
    /// (in int8 the quad from 4cp, quantised as `quant` says) at (r − 1, c + kx − 1) clamped (a
    /// one-tap op's single copy: kx = 1), zero past column w (the rows are `wp` words) and past
    /// cin (an int8 one-tap op's words past w and past cin's quads are left as they are: they
    /// meet only zero weights and outputs not kept).
    fn build_row(&self, x: &[f32], (h, w): (usize, usize), r: usize, relu: bool, quant: RowQuant, slab: &mut [u32]) {
        let (wp, cw) = (w.next_multiple_of(G), self.cw);
        let isa = self.isa();
        let ps = plane_words(RING, wp);
        let slot = (r % RING) * wp;
        let sy = r.saturating_sub(1).min(h - 1);
        if let RowQuant::Pixels(scale, zero) = quant {
            let rows: Vec<&[f32]> = (0..self.cin).map(|c| &x[(c * h + sy) * w..][..w]).collect();
            let planes = slab.chunks_mut(ps).take(self.cin.div_ceil(4)).map(|p| bytemuck::cast_slice_mut(&mut p[slot..slot + w])).collect();
            super::pixels::quantise_pixels(isa, &rows, relu, &mut scale[..w], &mut zero[..w], planes);
            return;
        }
        let per_word = if matches!(quant, RowQuant::Band(..)) { 4 } else { 2 };
        // Called once per output row: the zero row is made only where channels are padded
        // (cin not a whole number of tiles' words), not on every call.
        let zeros = if per_word * cw > self.cin { vec![0f32; w] } else { Vec::new() };
        // Channel c's input row sy (zeros past cin).
        let row = |c: usize| if c < self.cin { &x[(c * h + sy) * w..(c * h + sy + 1) * w] } else { &zeros[..] };
        if let RowQuant::Band(inv, z) = quant {
            debug_assert_eq!(self.taps, 9);
            for cq in 0..cw {
                let rows = [row(4 * cq), row(4 * cq + 1), row(4 * cq + 2), row(4 * cq + 3)];
                let at = |kx: usize| (kx * cw + cq) * ps + slot;
                let (head, rest) = slab.split_at_mut(at(1));
                let (mid, tail) = rest.split_at_mut(at(2) - at(1));
                super::quads3(isa, rows, relu, (inv, z), [&mut head[at(0)..][..wp], &mut mid[..wp], &mut tail[..wp]]);
            }
            return;
        }
        for cp in 0..cw {
            let (a, b) = (row(2 * cp), row(2 * cp + 1));
            let at = |kx: usize| (kx * cw + cp) * ps + slot;
            if self.taps == 1 {
                let centre = &mut slab[at(0)..][..wp];
                super::pairs(isa, a, b, relu, &mut centre[..w]);
                // Past the map: zero (they meet only outputs that are not kept).
                centre[w..].fill(0);
                continue;
            }
            // The three copies in one pass over the row (before, the centre's then two
            // shifted copies of it: `memmove` was 4 % of a ViT-S forward).
            let (head, rest) = slab.split_at_mut(at(1));
            let (mid, tail) = rest.split_at_mut(at(2) - at(1));
            super::pairs3(isa, a, b, relu, [&mut head[at(0)..][..wp], &mut mid[..wp], &mut tail[..wp]]);
        }
    }

    /// Output rows y0..y1 (of an upsampling op: output rows 2y0..2y1), rolling the slab's rows
    /// down the band ([`TileConv::build_row`]).
    ///
    /// The groups are pipelined as the linears' (`matmul::bf16::tiles::block`): a group's
    /// epilogue (bias, residual, the stores to the planes) runs a few rows per k step inside
    /// the next group's tile loop, two accumulator buffers taking turns, so that the vector
    /// units and the memory work while the tiles multiply.
    ///
    /// # Safety
    /// `slab` holds `copies() · cw · plane_words(RING, wp)` words; rows y0..y1 of every plane of `out`
    /// (cout × h·w; of an upsampling op rows 2y0..2y1 of cout × 4·h·w) are writable and this
    /// caller's alone.
    #[allow(clippy::too_many_arguments)]
    unsafe fn band<U: TileUnit>(
        &self,
        u: &mut U,
        x: &[f32],
        slab: &mut [u32],
        (h, w): (usize, usize),
        relu: bool,
        (y0, y1): (usize, usize),
        bias: &[f32],
        residual: Option<&[f32]>,
        out: MatMut<f32>,
    ) {
        let (cw, coutp, cout) = (self.cw, self.coutp, self.cout);
        let wp = w.next_multiple_of(G);
        let ps = plane_words(RING, wp);
        debug_assert!(slab.len() >= self.copies() * cw * ps && self.words.len() >= self.taps * coutp * cw);
        let plane = ps * 4; // bytes between a slab row's consecutive channel words
        let lda = cw * 4;
        // In int8: a 3x3 op's slab quantised per band, its (scale, inverse, zero point); a
        // one-tap op's per pixel, the scales and zero points of each ring row's pixels (one tap
        // reads one pixel: the epilogue takes each pixel's own). The tiles sum a 3x3 op's taps,
        // which read other pixels, before anything could scale them.
        let int8 = self.int8.is_some();
        let band_q = (int8 && self.taps == 9).then(|| self.band_quantisation(x, (h, w), relu, (y0, y1)));
        let pixel_q = int8 && self.taps == 1;
        let (mut px_scale, mut px_zero) = if pixel_q { (vec![0f32; RING * wp], vec![0i32; RING * wp]) } else { (Vec::new(), Vec::new()) };
        let mut accs = [Acc([0.0; G * G]), Acc([0.0; G * G])];
        // Raw pointers: the tiles write one buffer while the epilogue reads the other.
        let acc_ptrs = [accs[0].0.as_mut_ptr(), accs[1].0.as_mut_ptr()];
        let ldo = out.cols();
        // The epilogue of a pending group, in `units`: rows of a planar group, pairs of rows
        // (phase px = 0 and 1 of a channel) of an upsampling op's.
        let units = |p: &Pending| if self.phases_of.is_some() { ROWS } else { p.mv };
        // `px`: a one-tap int8 op's pixel scales and zero points (`px_scale`, `px_zero`).
        let finish = |p: Pending, r: std::ops::Range<usize>, px: (&[f32], &[i32])| {
            if r.is_empty() {
                return;
            }
            if let Some(q) = &self.int8 {
                // The i32 sums of the rows this call reads (and of their phase px = 1 twins 16
                // rows down in an upsampling op) as f32, in place: s_w · s · (Σ u·q − z · Σ q).
                // SAFETY: buffer `p.acc` holds the whole group, which the tiles no longer
                // write, and these rows are this call's alone.
                let acc = unsafe { std::slice::from_raw_parts_mut(acc_ptrs[p.acc], G * G) };
                let twins = if self.phases_of.is_some() { ROWS } else { 0 };
                // The group's pixels in its input row's slot (a one-tap op reads row y, slab row y + 1).
                let at = ((p.y + 1) % RING) * wp + p.x0;
                for i in r.clone().chain(r.start + twins..r.end + twins).take(if twins > 0 { 2 * r.len() } else { r.len() }) {
                    let (n, row) = (p.o0 + i, &mut acc[i * G..][..p.nv]);
                    match band_q {
                        Some((s, _, z)) => dequantise(U::AVX512, row, z.wrapping_mul(q.sums[n]), q.scale[n] * s),
                        None => dequantise_pixels(U::AVX512, row, q.sums[n], q.scale[n], (&px.0[at..][..p.nv], &px.1[at..][..p.nv])),
                    }
                }
            }
            // SAFETY: buffer `p.acc` holds the whole group, which the tiles no longer write
            // (they write the other one meanwhile).
            let acc = unsafe { std::slice::from_raw_parts(acc_ptrs[p.acc] as *const f32, G * G) };
            if let Some(oc) = self.phases_of {
                let (py, _, first) = phase_channel(p.o0, oc.div_ceil(ROWS));
                let (ow, oy) = (2 * w, 2 * p.y + py);
                for i in r {
                    let o = first + i;
                    if o >= oc {
                        break;
                    }
                    let at = oy * ow + 2 * p.x0;
                    let (even, odd) = (&acc[i * G..][..p.nv], &acc[(i + ROWS) * G..][..p.nv]);
                    let res = residual.map(|res| &res[o * ldo + at..][..2 * p.nv]);
                    #[cfg(target_arch = "x86_64")]
                    if U::AVX512 {
                        // SAFETY: `U::AVX512`: this CPU has AVX-512F; output row oy of plane
                        // o, columns 2x0.. 2x0 + 2nv, is this band's (the caller's promise).
                        unsafe { super::avx512::phase_row_out(even, odd, p.nv, bias[o], res.map(|r| r.as_ptr()), out.at(o, at)) };
                        continue;
                    }
                    // SAFETY: as above.
                    let dst = unsafe { std::slice::from_raw_parts_mut(out.at(o, at), 2 * p.nv) };
                    for (k, d) in dst.iter_mut().enumerate() {
                        *d = bias[o] + if k % 2 == 0 { even[k / 2] } else { odd[k / 2] } + res.map_or(0.0, |r| r[k]);
                    }
                }
                return;
            }
            let at = p.y * w + p.x0;
            #[cfg(target_arch = "x86_64")]
            if U::AVX512 {
                let (o0, rows) = (p.o0 + r.start, r.len());
                let res = residual.map(|res| res[o0 * ldo + at..].as_ptr());
                // SAFETY: `U::AVX512`: this CPU has AVX-512F; rows o0.. o0 + rows of the
                // planes, pixels at..at + nv, are this band's (the caller's promise) and inside
                // the residual (checked by `run_bands`).
                unsafe { super::avx512::tile_out(&acc[r.start * G..], G, rows, p.nv, &bias[o0..o0 + rows], res, out.at(o0, at), ldo) };
                return;
            }
            for o in r {
                let oc = p.o0 + o;
                // SAFETY: row y's pixels x0..x0 + nv of plane oc: this band's (caller).
                let dst = unsafe { std::slice::from_raw_parts_mut(out.at(oc, at), p.nv) };
                let src = &acc[o * G..o * G + p.nv];
                let res = residual.map(|res| &res[oc * ldo + at..][..p.nv]);
                for i in 0..p.nv {
                    dst[i] = bias[oc] + src[i] + res.map_or(0.0, |r| r[i]);
                }
            }
        };
        let mut pending: Option<Pending> = None;
        let mut turn = 0;
        let steps = self.taps * cw / ROWS;
        for y in y0..y1 {
            // Slab rows y..y + 2 (input rows y − 1 ..= y + 1) for this output row: the first
            // two are the previous row's.
            // (A one-tap op reads slab row y + 1 alone.)
            let first = if self.taps == 1 {
                y + 1
            } else if y == y0 {
                y
            } else {
                y + 2
            };
            for r in first..if self.taps == 1 { y + 2 } else { y + 3 } {
                let quant = match band_q {
                    Some((_, inv, z)) => RowQuant::Band(inv, z),
                    None if pixel_q => RowQuant::Pixels(&mut px_scale[(r % RING) * wp..][..wp], &mut px_zero[(r % RING) * wp..][..wp]),
                    None => RowQuant::Bf16,
                };
                self.build_row(x, (h, w), r, relu, quant, slab);
            }
            for x0 in (0..w).step_by(G) {
                let nv = (w - x0).min(G);
                for o0 in (0..cout).step_by(G) {
                    let mv = (cout - o0).min(G);
                    u.zero::<0>();
                    u.zero::<1>();
                    u.zero::<2>();
                    u.zero::<3>();
                    let mut done = 0;
                    let mut step = 0;
                    for t in 0..self.taps {
                        // The slab's copy and row of tap t (a one-tap op's: the centre's, its
                        // only copy).
                        let (ky, kx) = if self.taps == 9 { (t / 3, t % 3) } else { (1, 0) };
                        let a = self.words[(t * coutp + o0) * cw..].as_ptr() as *const u8;
                        let b = slab[kx * cw * ps + ((y + ky) % RING) * wp + x0..].as_ptr() as *const u8;
                        for cb in (0..cw).step_by(ROWS) {
                            // SAFETY: A: 32 rows of the tap's padded output channels from o0
                            // (coutp ≥ o0 + 32), 16 pairs from cb; B: 16 planes' rows from cb,
                            // 32 pixels from x0 (wp ≥ x0 + 32): all inside, on cache lines.
                            unsafe {
                                let (ak, bk) = (a.add(cb * 4), b.add(cb * plane));
                                u.load::<6>(bk, plane);
                                u.load::<4>(ak, lda);
                                dp::<U, 0, 4, 6>(u, int8);
                                if nv > ROWS {
                                    u.load::<7>(bk.add(64), plane);
                                    dp::<U, 1, 4, 7>(u, int8);
                                }
                                if mv > ROWS {
                                    u.load::<5>(ak.add(ROWS * lda), lda);
                                    dp::<U, 2, 5, 6>(u, int8);
                                    if nv > ROWS {
                                        dp::<U, 3, 5, 7>(u, int8);
                                    }
                                }
                            }
                            // The lines this group's epilogue will store to (during the
                            // next group's loop), asked for in the writable state a few rows
                            // per k step. The epilogue stores to 32 planes at once; where it
                            // also read a residual whose planes lay at the same offsets mod
                            // 4 KiB as the output's, its loads waited on those stores: a
                            // residual block's second convolution at ViT-S's 280x416 level
                            // took 10-12 ms against the first's 5, and 6.5-7.5 ms with this
                            // (an Intel Xeon with AMX, 2026-12-07).
                            if U::AVX512 && self.phases_of.is_none() {
                                out.prefetch_for_write(o0 + mv * step / steps..o0 + mv * (step + 1) / steps, y * w + x0, nv);
                            }
                            // Vector work beside the tiles': the previous group's epilogue.
                            if let Some(p) = pending {
                                let upto = units(&p) * (step + 1) / steps;
                                finish(p, done..upto, (&px_scale, &px_zero));
                                done = upto;
                            }
                            step += 1;
                        }
                    }
                    if let Some(p) = pending.take() {
                        finish(p, done..units(&p), (&px_scale, &px_zero));
                    }
                    let accp = acc_ptrs[turn] as *mut u8;
                    // SAFETY: buffer `turn` is 32 rows of 128 bytes, which the pending
                    // epilogue (finished above) no longer reads; each tile 16 rows, 64 wide.
                    unsafe {
                        u.store::<0>(accp, G * 4);
                        u.store::<1>(accp.add(64), G * 4);
                        u.store::<2>(accp.add(ROWS * G * 4), G * 4);
                        u.store::<3>(accp.add(ROWS * G * 4 + 64), G * 4);
                    }
                    pending = Some(Pending { acc: turn, y, x0, nv, o0, mv });
                    turn ^= 1;
                }
            }
        }
        if let Some(p) = pending {
            finish(p, 0..units(&p), (&px_scale, &px_zero));
        }
    }
}

/// How [`TileConv::build_row`] makes a slab row.
enum RowQuant<'a> {
    /// bf16 pairs.
    Bf16,
    /// A 3x3 int8 op's: u8 quads by the band's inverse scale and zero point.
    Band(f32, i32),
    /// A one-tap int8 op's: u8 quads per pixel, each pixel's scale and zero point written to
    /// the slices (the row's slot of them).
    Pixels(&'a mut [f32], &'a mut [i32]),
}

/// One group's accumulators, on a cache line.
#[repr(C, align(64))]
struct Acc([f32; G * G]);

/// A one-tap int8 op's accumulator row as f32, in place: the pixels' own scales and zero
/// points, ((i32 bits) − z[p] · `sum`) · `scale_w` · s[p]. On AVX-512 where `avx512` (a
/// [`TileUnit::AVX512`]).
#[inline(always)]
fn dequantise_pixels(avx512: bool, row: &mut [f32], sum: i32, scale_w: f32, (s, z): (&[f32], &[i32])) {
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        // SAFETY: `TileUnit::AVX512`: this CPU has AVX-512F.
        unsafe { super::avx512::dequantise_pixels(row, sum, scale_w, s, z) };
        return;
    }
    let _ = avx512;
    for ((v, &s), &z) in row.iter_mut().zip(s).zip(z) {
        *v = (v.to_bits() as i32).wrapping_sub(z.wrapping_mul(sum)) as f32 * (scale_w * s);
    }
}

/// Tile `C` += `A` · `B`: bf16 pairs into f32, or in `int8` s8 quads (the weights) by u8 quads
/// into i32.
#[inline(always)]
fn dp<U: TileUnit, const C: usize, const A: usize, const B: usize>(u: &mut U, int8: bool) {
    if int8 {
        u.dp_s8u8::<C, A, B>();
    } else {
        u.dp_bf16::<C, A, B>();
    }
}

/// An int8 accumulator row as f32, in place: ((i32 bits) − `zs`) · `mul`. On AVX-512 where
/// `avx512` (a [`TileUnit::AVX512`]).
#[inline(always)]
fn dequantise(avx512: bool, row: &mut [f32], zs: i32, mul: f32) {
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        // SAFETY: `TileUnit::AVX512`: this CPU has AVX-512F.
        unsafe { super::avx512::dequantise(row, zs, mul) };
        return;
    }
    let _ = avx512;
    for v in row {
        *v = (v.to_bits() as i32).wrapping_sub(zs) as f32 * mul;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::matmul::bf16::round_bf16;
    use crate::model::cpu::matmul::int8::to_u8;

    /// The weights (rows of k) as an op of `kind` multiplies them: bf16-rounded, or quantised
    /// per row (output channel).
    fn seen_weights(wt: &[f32], rows: usize, k: usize, kind: Kind) -> Vec<f64> {
        match kind {
            Kind::Bf16 => wt[..rows * k].iter().map(|&v| round_bf16(v) as f64).collect(),
            Kind::Int8 => {
                let (s, q) = quantise_weights(wt, rows, k);
                q.iter().enumerate().map(|(i, &q)| q as f64 * s[i / k] as f64).collect()
            }
        }
    }

    /// The input (cin, h, w) as an op of `kind` run in bands of `band` rows sees it, for each
    /// band (indexed by its first row / band): after the ReLU, bf16-rounded; or in int8
    /// quantised to u8 and dequantised: with 9 taps by the range of the input rows the band
    /// reads (its rows and one more each side), with one by each pixel's over its channels.
    #[allow(clippy::too_many_arguments)]
    fn seen_input(x: &[f32], cin: usize, (h, w): (usize, usize), relu: bool, kind: Kind, band: usize, taps: usize) -> Vec<Vec<f64>> {
        let f = |v: f32| if relu { v.max(0.0) } else { v };
        (0..h)
            .step_by(band)
            .map(|y0| match kind {
                Kind::Bf16 => x[..cin * h * w].iter().map(|&v| round_bf16(f(v)) as f64).collect(),
                // A one-tap op's: each pixel over its channels.
                Kind::Int8 if taps == 1 => {
                    let mut seen = vec![0f64; cin * h * w];
                    for p in 0..h * w {
                        let (lo, hi) = (0..cin).map(|c| f(x[c * h * w + p])).fold((0f32, 0f32), |(l, u), v| (l.min(v), u.max(v)));
                        let (s, inv, z) = range_scale(lo, hi);
                        for c in 0..cin {
                            seen[c * h * w + p] = (to_u8(f(x[c * h * w + p]), inv, z as f32) - z) as f64 * s as f64;
                        }
                    }
                    seen
                }
                Kind::Int8 => {
                    let y1 = (y0 + band).min(h);
                    let (r0, r1) = if taps == 9 { (y0.saturating_sub(1), (y1 + 1).min(h)) } else { (y0, y1) };
                    let read = (0..cin).flat_map(|c| x[(c * h + r0) * w..(c * h + r1) * w].iter().map(|&v| f(v)));
                    let (lo, hi) = read.fold((0f32, 0f32), |(l, u), v| (l.min(v), u.max(v)));
                    let (s, inv, z) = range_scale(lo, hi);
                    x[..cin * h * w].iter().map(|&v| (to_u8(f(v), inv, z as f32) - z) as f64 * s as f64).collect()
                }
            })
            .collect()
    }

    /// f64: bias [+ residual] + W * x, edges replicated, x (cin, h, w) as output row y's band
    /// sees it (`seen`, bands of `band` rows), W (cout, cin, 3, 3) as the op sees it.
    #[allow(clippy::too_many_arguments)]
    fn reference(seen: &[Vec<f64>], band: usize, wt: &[f64], bias: &[f32], res: Option<&[f32]>, cin: usize, cout: usize, h: usize, w: usize) -> Vec<f64> {
        let mut out = vec![0f64; cout * h * w];
        for o in 0..cout {
            for y in 0..h {
                // Output row y's band's view of (c, sy, sx), clamped.
                let xv = |c: usize, sy: isize, sx: isize| {
                    let (sy, sx) = (sy.clamp(0, h as isize - 1) as usize, sx.clamp(0, w as isize - 1) as usize);
                    seen[y / band][(c * h + sy) * w + sx]
                };
                for xx in 0..w {
                    let mut s = bias[o] as f64 + res.map_or(0.0, |r| r[(o * h + y) * w + xx] as f64);
                    for c in 0..cin {
                        for t in 0..9 {
                            let (ky, kx) = ((t / 3) as isize - 1, (t % 3) as isize - 1);
                            s += wt[(o * cin + c) * 9 + t] * xv(c, y as isize + ky, xx as isize + kx);
                        }
                    }
                    out[(o * h + y) * w + xx] = s;
                }
            }
        }
        out
    }

    /// Whether this machine runs the hardware's tiles (else the tests run the emulation only).
    fn hardware() -> bool {
        let hw = cfg!(target_arch = "x86_64") && crate::simd::isa::max() == Isa::Amx;
        if !hw {
            eprintln!("conv3x3 tiles: no usable AMX here, the emulation only");
        }
        hw
    }

    /// The largest difference from `want`, relative to its largest magnitude.
    fn rel_err(got: &[f32], want: &[f64]) -> f64 {
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(1e-6f64, |s, v| s.max(v.abs()));
        got.iter().zip(want).fold(0f64, |m, (&g, &r)| m.max((g as f64 - r).abs())) / scale
    }

    /// Every edge: one channel, odd channels, output channels and widths not multiples of 16 or
    /// 32, one row, bands of every height; with and without the ReLU and the residual; in bf16
    /// and int8; on the emulation everywhere and on the hardware where the CPU has AMX.
    #[test]
    fn tiles_match_the_reference() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let hardware = hardware();
        for &(cin, cout, h, w) in &[(1usize, 1usize, 1usize, 1usize), (3, 5, 4, 7), (16, 33, 3, 40), (33, 17, 5, 33), (64, 48, 6, 70), (70, 33, 3, 20)] {
            let x = crate::simd::test_values(&mut seed, cin * h * w);
            let wt = crate::simd::test_values(&mut seed, cout * cin * 9);
            let bias = crate::simd::test_values(&mut seed, cout);
            let res = crate::simd::test_values(&mut seed, cout * h * w);
            for kind in [Kind::Bf16, Kind::Int8] {
                let ws = seen_weights(&wt, cout, cin * 9, kind);
                for (relu, residual) in [(false, None), (true, Some(&res[..]))] {
                    for emulated in [true, false] {
                        if !emulated && !hardware {
                            continue;
                        }
                        let op = TileConv::new(&wt, cin, cout, kind, emulated);
                        assert_eq!(op.kind(), kind);
                        for band in [1, 2, h] {
                            let want = reference(&seen_input(&x, cin, (h, w), relu, kind, band, 9), band, &ws, &bias, residual, cin, cout, h, w);
                            let e = rel_err(&op.run_bands(&x, (h, w), relu, &bias, residual, band), &want);
                            assert!(e <= 1e-5, "{kind:?} cin={cin} cout={cout} {h}x{w} relu={relu} emulated={emulated} band={band}: rel err {e:e}");
                        }
                    }
                }
            }
        }
    }

    /// int8 against the f32 convolution: the quantisation's error is that of 8 bits (so the
    /// reference above is not one wrong in the same way), and a map whose rows differ in range
    /// by 1000x is quantised per band: the quiet band keeps its precision where a band of its
    /// own.
    #[test]
    fn int8_tiles_are_near_f32_and_quantise_per_band() {
        let mut seed = 0x853c_49e6_748f_ea9bu64;
        let hardware = hardware();
        let (cin, cout, h, w) = (32usize, 16usize, 8usize, 24usize);
        let mut x = crate::simd::test_values(&mut seed, cin * h * w);
        // Rows 4.. 1000x larger than rows ..4.
        for c in 0..cin {
            x[(c * h + 4) * w..(c + 1) * h * w].iter_mut().for_each(|v| *v *= 1000.0);
        }
        let wt = crate::simd::test_values(&mut seed, cout * cin * 9);
        let bias = vec![0f32; cout];
        let exact: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let ws: Vec<f64> = wt.iter().map(|&v| v as f64).collect();
        let want = reference(&[exact], h, &ws, &bias, None, cin, cout, h, w);
        for emulated in [true, false] {
            if !emulated && !hardware {
                continue;
            }
            let op = TileConv::new(&wt, cin, cout, Kind::Int8, emulated);
            // Rows 0..2 in bands of two: their band reads rows 0..3, all quiet.
            let got = op.run_bands(&x, (h, w), false, &bias, None, 2);
            for (rows, bound) in [(0..2, 0.02), (6..8, 0.02)] {
                let pick = |v: &[f32]| -> Vec<f32> { (0..cout).flat_map(|o| v[(o * h + rows.start) * w..(o * h + rows.end) * w].to_vec()).collect() };
                let want: Vec<f64> = (0..cout).flat_map(|o| want[(o * h + rows.start) * w..(o * h + rows.end) * w].to_vec()).collect();
                let e = rel_err(&pick(&got), &want);
                assert!(e <= bound, "emulated={emulated} rows {rows:?}: rel err {e:e} against f32");
            }
            // One band for the whole map: the quiet rows drown in the loud ones' steps.
            let whole = op.run_bands(&x, (h, w), false, &bias, None, h);
            let quiet = |v: &[f32]| -> Vec<f32> { (0..cout).flat_map(|o| v[o * h * w..(o * h + 2) * w].to_vec()).collect() };
            let want_quiet: Vec<f64> = (0..cout).flat_map(|o| want[o * h * w..(o * h + 2) * w].to_vec()).collect();
            assert!(rel_err(&quiet(&whole), &want_quiet) > 0.1, "emulated={emulated}: one band quantised the quiet rows as well as their own");
        }
    }

    /// The 1x1 convolution on one-tap tiles ([`TileConv::new_pointwise`]) against f64 on the
    /// values the op sees, with and without the ReLU and the residual: channels and widths not multiples
    /// of 16 or 32, one pixel, bands of every height; in bf16 and int8; on the emulation
    /// everywhere and on the hardware where the CPU has AMX.
    #[test]
    fn pointwise_tiles_match_the_reference() {
        let mut seed = 0xa54f_f53a_5f1d_36f1u64;
        let hardware = hardware();
        for &(cin, cout, h, w) in &[(1usize, 1usize, 1usize, 1usize), (3, 5, 2, 7), (40, 33, 5, 17), (64, 64, 4, 70), (70, 20, 3, 9)] {
            let x = crate::simd::test_values(&mut seed, cin * h * w);
            let wt = crate::simd::test_values(&mut seed, cout * cin);
            let bias = crate::simd::test_values(&mut seed, cout);
            let res = crate::simd::test_values(&mut seed, cout * h * w);
            for kind in [Kind::Bf16, Kind::Int8] {
                let ws = seen_weights(&wt, cout, cin, kind);
                for (relu, residual) in [(false, None), (true, Some(&res[..]))] {
                    for emulated in [true, false] {
                        if !emulated && !hardware {
                            continue;
                        }
                        let op = TileConv::new_pointwise(&wt, cin, cout, kind, emulated);
                        for band in [1, 2, h] {
                            let seen = seen_input(&x, cin, (h, w), relu, kind, band, 1);
                            let mut want = vec![0f64; cout * h * w];
                            for o in 0..cout {
                                for p in 0..h * w {
                                    let dot: f64 = (0..cin).map(|c| ws[o * cin + c] * seen[p / w / band][c * h * w + p]).sum();
                                    want[o * h * w + p] = bias[o] as f64 + dot + residual.map_or(0.0, |r| r[o * h * w + p] as f64);
                                }
                            }
                            let e = rel_err(&op.run_bands(&x, (h, w), relu, &bias, residual, band), &want);
                            assert!(e <= 1e-5, "{kind:?} cin={cin} cout={cout} {h}x{w} emulated={emulated} band={band} relu={relu}: rel err {e:e}");
                        }
                    }
                }
            }
        }
    }

    /// The upsampling op (phases interleaved by the epilogue) against the plain reference of
    /// its four phases' convolution, interleaved afterwards: output channels not multiples of
    /// 16, odd widths, one row and bands of every height, with and without the residual; in
    /// bf16 and int8.
    #[test]
    fn upsampled_tiles_match_the_phases_reference() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let hardware = hardware();
        for &(cin, cout, h, w) in &[(1usize, 1usize, 1usize, 1usize), (3, 5, 2, 7), (16, 17, 3, 33), (64, 32, 4, 40), (8, 33, 5, 17)] {
            let x = crate::simd::test_values(&mut seed, cin * h * w);
            let wt = crate::simd::test_values(&mut seed, cout * cin * 9);
            let bias = crate::simd::test_values(&mut seed, cout);
            let res = crate::simd::test_values(&mut seed, cout * 4 * h * w);
            let phased = super::super::phased_weights(&wt, cin, cout);
            for kind in [Kind::Bf16, Kind::Int8] {
                let ws = seen_weights(&phased, 4 * cout, cin * 9, kind);
                for residual in [None, Some(&res[..])] {
                    for emulated in [true, false] {
                        if !emulated && !hardware {
                            continue;
                        }
                        let op = TileConv::new_upsampling(&wt, cin, cout, kind, emulated);
                        for band in [1, 2, h] {
                            let seen = seen_input(&x, cin, (h, w), false, kind, band, 9);
                            let plain: Vec<f32> = reference(&seen, band, &ws, &bias.repeat(4), None, cin, 4 * cout, h, w).iter().map(|&v| v as f32).collect();
                            let want: Vec<f64> = super::super::interleave_phases(&plain, h, w, cout, residual).iter().map(|&v| v as f64).collect();
                            let e = rel_err(&op.run_bands(&x, (h, w), false, &bias, residual, band), &want);
                            assert!(
                                e <= 1e-5,
                                "{kind:?} cin={cin} cout={cout} {h}x{w} residual={} emulated={emulated} band={band}: rel err {e:e}",
                                residual.is_some()
                            );
                        }
                    }
                }
            }
        }
    }

    /// The transposed 2x2 convolution of stride 2 (one tap, its four phases interleaved by
    /// the epilogue) against f64 on the values the op sees: channels and widths not multiples
    /// of 16 or 32, one pixel, one row, bands of every height; in bf16 and int8; on the
    /// emulation everywhere and on the hardware where the CPU has AMX.
    #[test]
    fn transposed_tiles_match_the_reference() {
        let mut seed = 0x3c6e_f372_fe94_f82bu64;
        let hardware = hardware();
        for &(cin, cout, h, w) in &[(1usize, 1usize, 1usize, 1usize), (3, 5, 2, 7), (16, 17, 3, 33), (64, 32, 4, 40), (40, 33, 5, 17)] {
            let x = crate::simd::test_values(&mut seed, cin * h * w);
            // (cout·4, cin), rows (o, di, dj).
            let wt = crate::simd::test_values(&mut seed, 4 * cout * cin);
            let bias = crate::simd::test_values(&mut seed, cout);
            let (oh, ow) = (2 * h, 2 * w);
            for kind in [Kind::Bf16, Kind::Int8] {
                let ws = seen_weights(&wt, 4 * cout, cin, kind);
                let want = |band: usize| {
                    let seen = seen_input(&x, cin, (h, w), false, kind, band, 1);
                    let mut want = vec![0f64; cout * oh * ow];
                    for o in 0..cout {
                        for yy in 0..oh {
                            for xx in 0..ow {
                                let row = o * 4 + (yy % 2) * 2 + xx % 2;
                                let p = (yy / 2) * w + xx / 2;
                                want[(o * oh + yy) * ow + xx] =
                                    bias[o] as f64 + (0..cin).map(|c| ws[row * cin + c] * seen[yy / 2 / band][c * h * w + p]).sum::<f64>();
                            }
                        }
                    }
                    want
                };
                for emulated in [true, false] {
                    if !emulated && !hardware {
                        continue;
                    }
                    let op = TileConv::new_transposed(&wt, cin, cout, kind, emulated);
                    for band in [1, 2, h] {
                        let e = rel_err(&op.run_bands(&x, (h, w), false, &bias, None, band), &want(band));
                        assert!(e <= 1e-5, "{kind:?} cin={cin} cout={cout} {h}x{w} emulated={emulated} band={band}: rel err {e:e}");
                    }
                    // The op's own banding.
                    let own = h.div_ceil(rayon::current_num_threads() * BANDS_PER_THREAD).max(1);
                    let e = rel_err(&op.run_upsampled(&x, (h, w), &bias, None), &want(own));
                    assert!(e <= 1e-5, "{kind:?} cin={cin} cout={cout} {h}x{w} emulated={emulated}: rel err {e:e}");
                }
            }
        }
    }
}
