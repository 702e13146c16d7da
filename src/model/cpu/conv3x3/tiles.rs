//! The 3x3 convolution in bf16 on AMX tiles, direct (an implicit GEMM over the padded map): the
//! input converted to bf16 once per call, not once per tap as im2col's nine copies are.
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

use rayon::prelude::*;

use crate::model::cpu::matmul::bf16::pair;
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

/// A 3x3 convolution's weights as the tiles read them: per tap, per output channel (padded to
/// whole groups of 32 with zeros), its channel pairs (padded to whole tiles' 16 with zeros).
pub struct TileConv {
    cin: usize,
    cout: usize,
    /// 9 (a 3x3 convolution), or 1: with `phases_of`, a transposed 2x2 one of stride 2
    /// ([`TileConv::new_transposed`]), whose slab holds the centre tap's copy alone.
    taps: usize,
    /// Channel pairs per row, a multiple of 16.
    cps: usize,
    /// Output channels stored, a multiple of 32.
    coutp: usize,
    /// `[tap][output channel][channel pair]` (`taps` taps), on a cache line.
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
    pub fn new(w: &[f32], cin: usize, cout: usize, emulated: bool) -> Self {
        Self::with_taps(w, cin, cout, 9, emulated)
    }

    /// `nn.ConvTranspose2d(cin, cout, 2, stride=2)` from its weight as (cout·4, cin) with rows
    /// (o, di, dj): each output pixel (2i + di, 2j + dj) is a 1x1 product of input pixel (i,
    /// j), so it is the four phases (di, dj) of a one-tap op, interleaved by the epilogue as an
    /// upsampling op's ([`TileConv::run_upsampled`]). Before, a product into a zeroed (4·cout,
    /// h·w) buffer then a pass to interleave it.
    pub fn new_transposed(w: &[f32], cin: usize, cout: usize, emulated: bool) -> Self {
        assert!(w.len() >= 4 * cout * cin, "conv-transpose tiles: a weight of {} for {cout}x{cin}x2x2", w.len());
        let nb = cout.div_ceil(ROWS);
        let mut ordered = vec![0f32; 4 * nb * ROWS * cin];
        for (n, dst) in ordered.chunks_exact_mut(cin.max(1)).enumerate() {
            let (py, px, o) = phase_channel(n, nb);
            if o < cout {
                dst.copy_from_slice(&w[(o * 4 + py * 2 + px) * cin..][..cin]);
            }
        }
        let mut conv = Self::with_taps(&ordered, cin, 4 * nb * ROWS, 1, emulated);
        conv.phases_of = Some(cout);
        conv
    }

    /// `nn.Conv2d(cin, cout, 1)` from its (cout, cin) weight: one tap, the centre's.
    pub fn new_pointwise(w: &[f32], cin: usize, cout: usize, emulated: bool) -> Self {
        Self::with_taps(w, cin, cout, 1, emulated)
    }

    /// From a (cout, cin, taps) weight, `taps` 9 or 1.
    fn with_taps(w: &[f32], cin: usize, cout: usize, taps: usize, emulated: bool) -> Self {
        assert!(taps == 9 || taps == 1, "conv3x3 tiles: {taps} taps");
        assert!(w.len() >= cout * cin * taps, "conv3x3 tiles: a weight of {} for {cout}x{cin}x{taps}", w.len());
        let cps = cin.div_ceil(2 * ROWS) * ROWS;
        let coutp = cout.next_multiple_of(G);
        let mut words = Lines::<u32>::zeros(taps * coutp * cps);
        let at = |o: usize, c: usize, t: usize| if c < cin { w[(o * cin + c) * taps + t] } else { 0.0 };
        for t in 0..taps {
            for o in 0..cout {
                for cp in 0..cin.div_ceil(2) {
                    words[(t * coutp + o) * cps + cp] = pair(at(o, 2 * cp, t), at(o, 2 * cp + 1, t));
                }
            }
        }
        TileConv { cin, cout, taps, cps, coutp, words, emulated, phases_of: None }
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
    pub fn new_upsampling(w: &[f32], cin: usize, cout: usize, emulated: bool) -> Self {
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
        let mut conv = TileConv::new(&ordered, cin, 4 * nb * ROWS, emulated);
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
                let len = self.copies() * self.cps * plane_words(RING, wp);
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

    /// Slab row `r` (of the rolling three, slot r mod 3) = input row r − 1 (clamped: replicated
    /// edges): for kx in 0..copies, channel pair cp, column c: the pair of channels 2cp, 2cp + 1
    /// at (r − 1, c + kx − 1) clamped (a one-tap op's single copy: kx = 1), zero past column w
    /// (the rows are `wp` words) and past cin.
    fn build_row(&self, x: &[f32], (h, w): (usize, usize), r: usize, relu: bool, slab: &mut [u32]) {
        let (wp, cps) = (w.next_multiple_of(G), self.cps);
        let isa = if self.emulated { Isa::Portable } else { crate::simd::isa::usable(Isa::Avx512Bf16) };
        // Called once per output row: the zero row is made only where channels are padded
        // (cin not a whole number of tiles' pairs), not on every call.
        let zeros = if 2 * cps > self.cin { vec![0f32; w] } else { Vec::new() };
        let sy = r.saturating_sub(1).min(h - 1);
        // Channel c's input row sy (zeros past cin).
        let row = |c: usize| if c < self.cin { &x[(c * h + sy) * w..(c * h + sy + 1) * w] } else { &zeros[..] };
        let ps = plane_words(RING, wp);
        let slot = (r % RING) * wp;
        for cp in 0..cps {
            let (a, b) = (row(2 * cp), row(2 * cp + 1));
            let at = |kx: usize| (kx * cps + cp) * ps + slot;
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
    /// `slab` holds `copies() · cps · plane_words(RING, wp)` words; rows y0..y1 of every plane of `out`
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
        let (cps, coutp, cout) = (self.cps, self.coutp, self.cout);
        let wp = w.next_multiple_of(G);
        let ps = plane_words(RING, wp);
        debug_assert!(slab.len() >= self.copies() * cps * ps && self.words.len() >= self.taps * coutp * cps);
        let plane = ps * 4; // bytes between a slab row's consecutive channel pairs
        let lda = cps * 4;
        let mut accs = [Acc([0.0; G * G]), Acc([0.0; G * G])];
        // Raw pointers: the tiles write one buffer while the epilogue reads the other.
        let acc_ptrs = [accs[0].0.as_mut_ptr(), accs[1].0.as_mut_ptr()];
        let ldo = out.cols();
        // The epilogue of a pending group, in `units`: rows of a planar group, pairs of rows
        // (phase px = 0 and 1 of a channel) of an upsampling op's.
        let units = |p: &Pending| if self.phases_of.is_some() { ROWS } else { p.mv };
        let finish = |p: Pending, r: std::ops::Range<usize>| {
            if r.is_empty() {
                return;
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
        let steps = self.taps * cps / ROWS;
        for y in y0..y1 {
            // Slab rows y..y + 2 (input rows y − 1 ..= y + 1) for this output row: the first
            // two are the previous row's.
            let first = if y == y0 { y } else { y + 2 };
            for r in first..y + 3 {
                self.build_row(x, (h, w), r, relu, slab);
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
                        let a = self.words[(t * coutp + o0) * cps..].as_ptr() as *const u8;
                        let b = slab[kx * cps * ps + ((y + ky) % RING) * wp + x0..].as_ptr() as *const u8;
                        for cb in (0..cps).step_by(ROWS) {
                            // SAFETY: A: 32 rows of the tap's padded output channels from o0
                            // (coutp ≥ o0 + 32), 16 pairs from cb; B: 16 planes' rows from cb,
                            // 32 pixels from x0 (wp ≥ x0 + 32): all inside, on cache lines.
                            unsafe {
                                let (ak, bk) = (a.add(cb * 4), b.add(cb * plane));
                                u.load::<6>(bk, plane);
                                u.load::<4>(ak, lda);
                                u.dp_bf16::<0, 4, 6>();
                                if nv > ROWS {
                                    u.load::<7>(bk.add(64), plane);
                                    u.dp_bf16::<1, 4, 7>();
                                }
                                if mv > ROWS {
                                    u.load::<5>(ak.add(ROWS * lda), lda);
                                    u.dp_bf16::<2, 5, 6>();
                                    if nv > ROWS {
                                        u.dp_bf16::<3, 5, 7>();
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
                                finish(p, done..upto);
                                done = upto;
                            }
                            step += 1;
                        }
                    }
                    if let Some(p) = pending.take() {
                        finish(p, done..units(&p));
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
            finish(p, 0..units(&p));
        }
    }
}

/// One group's accumulators, on a cache line.
#[repr(C, align(64))]
struct Acc([f32; G * G]);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::matmul::bf16::round_bf16;

    /// f64 on bf16-rounded inputs: bias [+ residual] + W * relu?(x), edges replicated.
    #[allow(clippy::too_many_arguments)]
    fn reference(x: &[f32], wt: &[f32], bias: &[f32], res: Option<&[f32]>, cin: usize, cout: usize, h: usize, w: usize, relu: bool) -> Vec<f64> {
        let xv = |c: usize, y: isize, xx: isize| {
            let (y, xx) = (y.clamp(0, h as isize - 1) as usize, xx.clamp(0, w as isize - 1) as usize);
            let v = x[(c * h + y) * w + xx];
            round_bf16(if relu { v.max(0.0) } else { v }) as f64
        };
        let mut out = vec![0f64; cout * h * w];
        for o in 0..cout {
            for y in 0..h {
                for xx in 0..w {
                    let mut s = bias[o] as f64 + res.map_or(0.0, |r| r[(o * h + y) * w + xx] as f64);
                    for c in 0..cin {
                        for t in 0..9 {
                            let (ky, kx) = ((t / 3) as isize - 1, (t % 3) as isize - 1);
                            s += round_bf16(wt[(o * cin + c) * 9 + t]) as f64 * xv(c, y as isize + ky, xx as isize + kx);
                        }
                    }
                    out[(o * h + y) * w + xx] = s;
                }
            }
        }
        out
    }

    /// Every edge: one channel, odd channels, output channels and widths not multiples of 16 or
    /// 32, one row, bands of every height; with and without the ReLU and the residual; on the
    /// emulation everywhere and on the hardware where the CPU has AMX.
    #[test]
    fn tiles_match_the_reference() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let hardware = cfg!(target_arch = "x86_64") && crate::simd::isa::max() == Isa::Amx;
        if !hardware {
            eprintln!("conv3x3 tiles: no usable AMX here, the emulation only");
        }
        for &(cin, cout, h, w) in &[(1usize, 1usize, 1usize, 1usize), (3, 5, 4, 7), (16, 33, 3, 40), (33, 17, 5, 33), (64, 48, 6, 70)] {
            let x = crate::simd::test_values(&mut seed, cin * h * w);
            let wt = crate::simd::test_values(&mut seed, cout * cin * 9);
            let bias = crate::simd::test_values(&mut seed, cout);
            let res = crate::simd::test_values(&mut seed, cout * h * w);
            for (relu, residual) in [(false, None), (true, Some(&res[..]))] {
                let want = reference(&x, &wt, &bias, residual, cin, cout, h, w, relu);
                let scale = want.iter().fold(1e-6f64, |s, v| s.max(v.abs()));
                for emulated in [true, false] {
                    if !emulated && !hardware {
                        continue;
                    }
                    let op = TileConv::new(&wt, cin, cout, emulated);
                    for band in [1, 2, h] {
                        let got = op.run_bands(&x, (h, w), relu, &bias, residual, band);
                        let e = got.iter().zip(&want).fold(0f64, |m, (&g, &r)| m.max((g as f64 - r).abs())) / scale;
                        assert!(e <= 1e-5, "cin={cin} cout={cout} {h}x{w} relu={relu} emulated={emulated} band={band}: rel err {e:e}");
                    }
                }
            }
        }
    }

    /// The 1x1 convolution on one-tap tiles ([`TileConv::new_pointwise`]) against f64 on
    /// bf16-rounded inputs, with and without the residual: channels and widths not multiples
    /// of 16 or 32, one pixel, bands of every height; on the emulation everywhere and on the
    /// hardware where the CPU has AMX.
    #[test]
    fn pointwise_tiles_match_the_reference() {
        let mut seed = 0xa54f_f53a_5f1d_36f1u64;
        let hardware = cfg!(target_arch = "x86_64") && crate::simd::isa::max() == Isa::Amx;
        for &(cin, cout, h, w) in &[(1usize, 1usize, 1usize, 1usize), (3, 5, 2, 7), (40, 33, 5, 17), (64, 64, 4, 70)] {
            let x = crate::simd::test_values(&mut seed, cin * h * w);
            let wt = crate::simd::test_values(&mut seed, cout * cin);
            let bias = crate::simd::test_values(&mut seed, cout);
            let res = crate::simd::test_values(&mut seed, cout * h * w);
            for residual in [None, Some(&res[..])] {
                let mut want = vec![0f64; cout * h * w];
                for o in 0..cout {
                    for p in 0..h * w {
                        let dot: f64 = (0..cin).map(|c| round_bf16(wt[o * cin + c]) as f64 * round_bf16(x[c * h * w + p]) as f64).sum();
                        want[o * h * w + p] = bias[o] as f64 + dot + residual.map_or(0.0, |r| r[o * h * w + p] as f64);
                    }
                }
                let scale = want.iter().fold(1e-6f64, |s, v| s.max(v.abs()));
                for emulated in [true, false] {
                    if !emulated && !hardware {
                        continue;
                    }
                    let op = TileConv::new_pointwise(&wt, cin, cout, emulated);
                    for band in [1, 2, h] {
                        let got = op.run_bands(&x, (h, w), false, &bias, residual, band);
                        let e = got.iter().zip(&want).fold(0f64, |m, (&g, &r)| m.max((g as f64 - r).abs())) / scale;
                        assert!(e <= 1e-5, "cin={cin} cout={cout} {h}x{w} emulated={emulated} band={band} residual={}: rel err {e:e}", residual.is_some());
                    }
                }
            }
        }
    }

    /// The upsampling op (phases interleaved by the epilogue) against the plain reference of
    /// its four phases' convolution, interleaved afterwards: output channels not multiples of
    /// 16, odd widths, one row and bands of every height, with and without the residual.
    #[test]
    fn upsampled_tiles_match_the_phases_reference() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let hardware = cfg!(target_arch = "x86_64") && crate::simd::isa::max() == Isa::Amx;
        for &(cin, cout, h, w) in &[(1usize, 1usize, 1usize, 1usize), (3, 5, 2, 7), (16, 17, 3, 33), (64, 32, 4, 40), (8, 33, 5, 17)] {
            let x = crate::simd::test_values(&mut seed, cin * h * w);
            let wt = crate::simd::test_values(&mut seed, cout * cin * 9);
            let bias = crate::simd::test_values(&mut seed, cout);
            let res = crate::simd::test_values(&mut seed, cout * 4 * h * w);
            let phased = super::super::phased_weights(&wt, cin, cout);
            let plain: Vec<f32> = reference(&x, &phased, &bias.repeat(4), None, cin, 4 * cout, h, w, false).iter().map(|&v| v as f32).collect();
            for residual in [None, Some(&res[..])] {
                let want = super::super::interleave_phases(&plain, h, w, cout, residual);
                let scale = want.iter().fold(1e-6f32, |s, v| s.max(v.abs())) as f64;
                for emulated in [true, false] {
                    if !emulated && !hardware {
                        continue;
                    }
                    let op = TileConv::new_upsampling(&wt, cin, cout, emulated);
                    for band in [1, 2, h] {
                        let got = op.run_bands(&x, (h, w), false, &bias, residual, band);
                        assert_eq!(got.len(), want.len());
                        let e = got.iter().zip(&want).fold(0f64, |m, (&g, &r)| m.max((g as f64 - r as f64).abs())) / scale;
                        assert!(e <= 1e-5, "cin={cin} cout={cout} {h}x{w} residual={} emulated={emulated} band={band}: rel err {e:e}", residual.is_some());
                    }
                }
            }
        }
    }

    /// The transposed 2x2 convolution of stride 2 (one tap, its four phases interleaved by
    /// the epilogue) against f64 on bf16-rounded inputs: channels and widths not multiples of
    /// 16 or 32, one pixel, one row, bands of every height; on the emulation everywhere and on
    /// the hardware where the CPU has AMX.
    #[test]
    fn transposed_tiles_match_the_reference() {
        let mut seed = 0x3c6e_f372_fe94_f82bu64;
        let hardware = cfg!(target_arch = "x86_64") && crate::simd::isa::max() == Isa::Amx;
        for &(cin, cout, h, w) in &[(1usize, 1usize, 1usize, 1usize), (3, 5, 2, 7), (16, 17, 3, 33), (64, 32, 4, 40), (40, 33, 5, 17)] {
            let x = crate::simd::test_values(&mut seed, cin * h * w);
            // (cout·4, cin), rows (o, di, dj).
            let wt = crate::simd::test_values(&mut seed, 4 * cout * cin);
            let bias = crate::simd::test_values(&mut seed, cout);
            let (oh, ow) = (2 * h, 2 * w);
            let mut want = vec![0f64; cout * oh * ow];
            for o in 0..cout {
                for yy in 0..oh {
                    for xx in 0..ow {
                        let row = o * 4 + (yy % 2) * 2 + xx % 2;
                        let p = (yy / 2) * w + xx / 2;
                        want[(o * oh + yy) * ow + xx] =
                            bias[o] as f64 + (0..cin).map(|c| round_bf16(wt[row * cin + c]) as f64 * round_bf16(x[c * h * w + p]) as f64).sum::<f64>();
                    }
                }
            }
            let scale = want.iter().fold(1e-6f64, |s, v| s.max(v.abs()));
            for emulated in [true, false] {
                if !emulated && !hardware {
                    continue;
                }
                let op = TileConv::new_transposed(&wt, cin, cout, emulated);
                for band in [1, 2, h] {
                    let got = op.run_bands(&x, (h, w), false, &bias, None, band);
                    assert_eq!(got.len(), want.len());
                    let e = got.iter().zip(&want).fold(0f64, |m, (&g, &r)| m.max((g as f64 - r).abs())) / scale;
                    assert!(e <= 1e-5, "cin={cin} cout={cout} {h}x{w} emulated={emulated} band={band}: rel err {e:e}");
                }
                // The op's own banding.
                let got = op.run_upsampled(&x, (h, w), &bias, None);
                let e = got.iter().zip(&want).fold(0f64, |m, (&g, &r)| m.max((g as f64 - r).abs())) / scale;
                assert!(e <= 1e-5, "cin={cin} cout={cout} {h}x{w} emulated={emulated}: rel err {e:e}");
            }
        }
    }
}
