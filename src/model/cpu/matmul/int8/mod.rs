//! Int8 products for the ViT's linear layers (`--precision int8`). Weights are quantised
//! symmetrically per output channel (s8, scale max|w|/127) once, at load; activations
//! asymmetrically per token on every call (u8 with a zero point, over [min(x, 0), max(x, 0)], so
//! that 0 is exact); products are summed in int32 and scaled back to f32 with the bias:
//!
//! `y[i,o] = s_a[i] · s_w[o] · (Σ_k u[i,k]·q[o,k] − z[i] · Σ_k q[o,k]) + b[o]`
//!
//! u8 × s8 is what `vpdpbusd` multiplies: four products summed into each i32 lane per
//! instruction. Measured on an Intel Xeon with AVX-512 (`cpu family 6`, 24 independent chains
//! on one core): zmm `vpdpbusd` 745 G int ops/s, ymm (AVX-VNNI) 373, zmm f32 FMA 102 GFLOP/s,
//! zmm `vdpbf16ps` 88: 7.3x f32's multiply-adds per second there, where bf16 is slower than f32.
//!
//! Routes ([`route`]): AVX512-VNNI (a 12×32 register tile of zmm) where the level is AVX-512
//! and the CPU has it; AVX-VNNI (6×16 of ymm) at the AVX2 level and up where the CPU has that;
//! anywhere else the same quantisation emulated ([`Store::Dequantised`]): the activations
//! quantised and dequantised, times the dequantised weights, by the f32 product. No faster than
//! f32, but the numbers of int8 on any CPU. On aarch64: `usmmla` at the i8mm level and `sdot`
//! at dotprod's (`neon.rs`, 8 × 8 tiles). An AVX2 route through `vpmaddubsw` is left out:
//! its 16-bit pair sums saturate on full-range u8 × s8 (2 · 255 · 127 > 32767).
//!
//! Layouts. A weight panel holds NR output channels (32, or 16 on AVX-VNNI); for each group of
//! four k (a "quad") its NR i32 words side by side, each word the four s8 weights of one channel,
//! K padded to a multiple of 4 with zero weights. The activations are rows of u8 padded the same
//! way (the pad's value is multiplied by zero weights), read one quad (one i32) at a time and
//! broadcast.

use rayon::prelude::*;

use crate::simd::isa::{self, Isa};
use crate::simd::{Lines, MatMut};

/// The code path of the int8 products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Intel AMX tiles (`tdpbusd`, [`tiles`]), where the CPU has AMX-INT8 and the kernel granted
    /// the tile state.
    Amx,
    /// The same tile route on the tiles' emulation: never chosen by [`route`], built by tests
    /// so that every machine runs its packing and loops.
    AmxEmulated,
    Avx512Vnni,
    AvxVnni,
    /// aarch64 `usmmla` (FEAT_I8MM), panels in octets of channel pairs ([`neon`]).
    I8mm,
    /// aarch64 `sdot` by element (FEAT_DotProd), the activations' top bit flipped ([`neon`]).
    Dotprod,
    /// Quantised and dequantised, through the f32 product.
    Emulated,
}

impl Route {
    pub fn name(self) -> &'static str {
        match self {
            Route::Amx => "amx",
            Route::AmxEmulated => "amx-emulated",
            Route::Avx512Vnni => "avx512vnni",
            Route::AvxVnni => "avxvnni",
            Route::I8mm => "i8mm",
            Route::Dotprod => "dotprod",
            Route::Emulated => "emulated",
        }
    }

    /// Output channels per weight panel.
    fn nr(self) -> usize {
        match self {
            Route::Amx | Route::AmxEmulated => tiles::NR,
            Route::Avx512Vnni => 32,
            Route::AvxVnni => 16,
            Route::I8mm | Route::Dotprod => NEON_TILE,
            Route::Emulated => 1,
        }
    }

    /// Rows per register tile.
    fn mr(self) -> usize {
        match self {
            Route::Amx | Route::AmxEmulated => tiles::MR,
            Route::Avx512Vnni => 12,
            Route::AvxVnni => 6,
            Route::I8mm | Route::Dotprod => NEON_TILE,
            Route::Emulated => 1,
        }
    }

    /// The route without tiles, for kernels that have no tile code (the 3x3 convolution's):
    /// AMX CPUs have AVX512-VNNI.
    pub fn without_tiles(self) -> Route {
        match self {
            Route::Amx => Route::Avx512Vnni,
            Route::AmxEmulated => Route::Emulated,
            r => r,
        }
    }

    fn tiles(self) -> bool {
        matches!(self, Route::Amx | Route::AmxEmulated)
    }

    /// Quads of K stored per weight panel (and per row of activations): whole tiles' 16 on the
    /// tile routes, four (a register of a row) on dotprod's, an octet on i8mm's.
    /// Bytes from one quantised row to the next: its quads, on the tile routes rounded to an
    /// odd number of cache lines. At a power of two (ViT-L's K = 4096: 4 KiB) an A tile's 16
    /// rows fell in one of L1's 64 sets of 12 ways, and its loads missed (the bf16 tiles'
    /// `tile_a_stride`).
    fn stride(self, k: usize) -> usize {
        let bytes = 4 * self.quads(k);
        if self.tiles() {
            (bytes.div_ceil(64) | 1) * 64
        } else {
            bytes
        }
    }

    fn quads(self, k: usize) -> usize {
        match self {
            Route::Amx | Route::AmxEmulated => k.div_ceil(64) * 16,
            Route::Dotprod => k.div_ceil(16) * 4,
            Route::I8mm => k.div_ceil(8) * 2,
            _ => k.div_ceil(4),
        }
    }
}

/// The route of the int8 products at `level` on this CPU.
pub fn route(level: Isa) -> Route {
    let vnni = isa::vnni();
    #[cfg(target_arch = "x86_64")]
    if level >= Isa::Amx && *crate::simd::amx::support() == (crate::simd::amx::Support::Usable { int8: true }) {
        return Route::Amx;
    }
    // The aarch64 levels are below AVX2's, and their extensions are the levels themselves.
    if level >= Isa::Avx512 && vnni.avx512 {
        Route::Avx512Vnni
    } else if level >= Isa::Avx2 && vnni.avx {
        Route::AvxVnni
    } else if cfg!(target_arch = "aarch64") && (Isa::I8mm..=Isa::Bf16).contains(&level) {
        Route::I8mm
    } else if cfg!(target_arch = "aarch64") && level == Isa::Dotprod {
        Route::Dotprod
    } else {
        Route::Emulated
    }
}

/// Rows and columns of the aarch64 routes' register tiles.
const NEON_TILE: usize = 8;

/// `v` rounded to the nearest integer, ties to even, for |v| < 2²²: adding 1.5 · 2²³ leaves no
/// fraction bits, so the add rounds (in the default mode) and the subtraction is exact. Written
/// out rather than `f32::round_ties_even`, which the baseline x86-64 target calls a library
/// function for, so that the loops below vectorise on every route and round alike on all.
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// `v · inv` rounded, plus the zero point `z`, within [0, 255] (NaN: 0): a u8 activation, in a
/// form that vectorises (Rust's saturating float-to-int cast does not; this one cannot
/// overflow, so it needs none).
#[inline(always)]
pub(in crate::model::cpu) fn to_u8(v: f32, inv: f32, z: f32) -> i32 {
    let t = round_even(v * inv) + z;
    let t = if t >= 0.0 { t } else { 0.0 };
    let t = if t <= 255.0 { t } else { 255.0 };
    // SAFETY: t is finite and within [0, 255] (the comparisons above send NaN to 0).
    unsafe { t.to_int_unchecked::<i32>() }
}

/// The u8 quantisation of values within [lo, hi] (lo ≤ 0 ≤ hi): scale, its inverse and the zero
/// point. All zeros, or infinities: any scale will do (the result is 0, or as undefined as
/// f32's). One formula for the tokens of the linears and the pixels of the convolutions.
#[inline(always)]
pub(in crate::model::cpu) fn range_scale(lo: f32, hi: f32) -> (f32, f32, i32) {
    let s = (hi - lo) / 255.0;
    let s = if s > 0.0 && s.is_finite() { s } else { 1.0 };
    let inv = 1.0 / s;
    (s, inv, to_u8(-lo, inv, 0.0))
}

/// The weights of one linear, PyTorch's (out, in), quantised per output channel.
pub struct QuantB {
    n: usize,
    k: usize,
    /// s_w per output channel (padded with zeros to whole panels on the VNNI routes).
    scale: Vec<f32>,
    store: Store,
}

pub(crate) enum Store {
    /// The VNNI routes' panels (see the module's documentation), with Σ_k q[o,k] per channel.
    Panels { route: Route, words: Lines<i32>, colsum: Vec<i32> },
    /// q[o,k] · s_w[o] as f32, (out, in), for the emulated route.
    Dequantised(Vec<f32>),
}

/// Per-output-channel quantisation of the (n, k) weight `w`: the scales and the s8 values,
/// row-major. A channel of zeros gets scale 1 (its values are 0 whatever the scale).
pub fn quantise_weights(w: &[f32], n: usize, k: usize) -> (Vec<f32>, Vec<i8>) {
    assert!(w.len() >= n * k, "int8: weight of {} values for {n}x{k}", w.len());
    let mut q = vec![0i8; n * k];
    let mut scale = vec![0f32; n];
    if k == 0 {
        return (vec![1.0; n], q);
    }
    q.par_chunks_mut(k).zip(scale.par_iter_mut()).zip(w.par_chunks(k)).for_each(|((q, s), w)| {
        let max = w.iter().fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
        *s = if max > 0.0 && max.is_finite() { max / 127.0 } else { 1.0 };
        let inv = 1.0 / *s;
        for (q, &v) in q.iter_mut().zip(w) {
            *q = (round_even(v * inv) as i32).clamp(-127, 127) as i8;
        }
    });
    (scale, q)
}

impl QuantB {
    /// Quantises the (n, k) weight `w` for the route of `level`.
    pub fn from_f32_nk(w: &[f32], n: usize, k: usize, level: Isa) -> Self {
        Self::for_route(w, n, k, route(isa::usable(level)))
    }

    /// Quantised for `route`, which the CPU must have (or an emulated one).
    pub(crate) fn for_route(w: &[f32], n: usize, k: usize, route: Route) -> Self {
        let (scale, q) = quantise_weights(w, n, k);
        Self::from_quantised(scale, &q, n, k, route)
    }

    /// From weights quantised already: (n, k) s8 values `q` and a scale per output channel (a
    /// convolution's taps share theirs).
    pub(crate) fn from_quantised(mut scale: Vec<f32>, q: &[i8], n: usize, k: usize, route: Route) -> Self {
        assert!(scale.len() == n && q.len() == n * k, "int8: {} scales and {} values for {n}x{k}", scale.len(), q.len());
        let store = match route {
            Route::Emulated => {
                let mut w = vec![0f32; n * k];
                if k > 0 {
                    w.par_chunks_mut(k)
                        .zip(q.par_chunks(k))
                        .zip(scale.par_iter())
                        .for_each(|((w, q), s)| w.iter_mut().zip(q).for_each(|(w, &q)| *w = q as f32 * s));
                }
                Store::Dequantised(w)
            }
            Route::Amx | Route::AmxEmulated | Route::Avx512Vnni | Route::AvxVnni | Route::Dotprod | Route::I8mm => {
                let nr = route.nr();
                let (panels, kq) = (n.div_ceil(nr), route.quads(k));
                let mut words = Lines::<i32>::zeros(panels * kq * nr);
                let mut colsum = vec![0i32; panels * nr];
                if kq > 0 {
                    words.par_chunks_mut(kq * nr).zip(colsum.par_chunks_mut(nr)).enumerate().for_each(|(p, (panel, sums))| {
                        for (j, sum) in sums.iter_mut().enumerate() {
                            let o = p * nr + j;
                            if o >= n {
                                break;
                            }
                            let row = &q[o * k..(o + 1) * k];
                            *sum = row.iter().map(|&v| v as i32).sum();
                            for (quad, four) in row.chunks(4).enumerate() {
                                let mut b = [0u8; 4];
                                four.iter().zip(&mut b).for_each(|(&v, b)| *b = v as u8);
                                // i8mm: per octet, channel pairs of 8 bytes each (a channel's
                                // two quads side by side); elsewhere a quad's NR words.
                                let at = if route == Route::I8mm { (quad / 2) * 2 * nr + (j / 2) * 4 + (j % 2) * 2 + quad % 2 } else { quad * nr + j };
                                panel[at] = i32::from_le_bytes(b);
                            }
                        }
                    });
                }
                scale.resize(panels * nr, 0.0);
                Store::Panels { route, words, colsum }
            }
        };
        Self { n, k, scale, store }
    }

    /// The route the weights were packed for.
    pub fn route(&self) -> Route {
        match &self.store {
            Store::Panels { route, .. } => *route,
            Store::Dequantised(_) => Route::Emulated,
        }
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }
}

/// One row of activations as u8 with its zero point: returns (scale, zero). `out` is the row
/// padded to whole quads; the pad is left as it is (it meets zero weights).
#[inline(always)]
fn quantise_row(x: &[f32], out: &mut [u8]) -> (f32, i32) {
    let (lo, hi) = row_range(x);
    quantise_in_range(x, out, lo, hi)
}

/// The range of `x` with 0, [lo, hi] (lo ≤ 0 ≤ hi): a NaN is never taken.
#[inline(always)]
fn row_range(x: &[f32]) -> (f32, f32) {
    // Lane-wise minimum and maximum (`if v < lo` is `minps`'s own rule), starting from 0 so
    // that the range holds 0.
    let (mut lo, mut hi) = ([0f32; 16], [0f32; 16]);
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..16 {
            lo[j] = if c[j] < lo[j] { c[j] } else { lo[j] };
            hi[j] = if c[j] > hi[j] { c[j] } else { hi[j] };
        }
    }
    for (j, &v) in tail.iter().enumerate() {
        lo[j] = if v < lo[j] { v } else { lo[j] };
        hi[j] = if v > hi[j] { v } else { hi[j] };
    }
    let lo = lo.iter().fold(0f32, |m, &v| if v < m { v } else { m });
    let hi = hi.iter().fold(0f32, |m, &v| if v > m { v } else { m });
    (lo, hi)
}

/// [`row_range`] on AVX-512 where `isa` has it (the int8 convolution tiles' bands).
pub(in crate::model::cpu) fn range(isa: Isa, x: &[f32]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: the level is AVX-512 (with BW, below AVX512-BF16's) only where the CPU has it.
        return unsafe { range_avx512(x) };
    }
    let _ = isa;
    row_range(x)
}

/// The second half of [`quantise_row`]: the row as u8 over [lo, hi] (its range, with 0).
#[inline(always)]
fn quantise_in_range(x: &[f32], out: &mut [u8], lo: f32, hi: f32) -> (f32, i32) {
    let (s, inv, z) = range_scale(lo, hi);
    let zf = z as f32;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = to_u8(v, inv, zf) as u8;
    }
    (s, z)
}

/// Activations quantised per row: `rows` rows of `stride` bytes (k values, then the pad).
pub struct QuantA {
    /// The rows of u8, `stride` bytes apart from [`QuantA::bytes`]'s start (on a cache line),
    /// with 32 rows of zeros after them on the tile routes (a tile reads whole rows of 16).
    data: Lines<u32>,
    pub rows: usize,
    /// Rows there is room for.
    capacity: usize,
    pub k: usize,
    pub stride: usize,
    pub scale: Vec<f32>,
    pub zero: Vec<i32>,
}

impl QuantA {
    /// The quantised rows: row i at `i · stride`.
    pub fn bytes(&self) -> &[u8] {
        let words: &[u32] = &self.data;
        // SAFETY: the words' bytes, initialised and borrowed with them; u8 has no alignment.
        unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 4) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let words: &mut [u32] = &mut self.data;
        // SAFETY: as `bytes`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, words.len() * 4) }
    }

    /// Room for up to `capacity` rows of `k` values quantised for `route` (and the tile routes'
    /// rows of padding after them), holding none: [`QuantA::gather`] fills it.
    pub(crate) fn with_rows(capacity: usize, k: usize, route: Route) -> Self {
        let stride = route.stride(k);
        let rows = if route.tiles() { capacity + tiles::MR } else { capacity };
        QuantA {
            data: Lines::zeros((rows * stride).div_ceil(4)),
            rows: 0,
            capacity,
            k,
            stride,
            scale: Vec::with_capacity(capacity),
            zero: Vec::with_capacity(capacity),
        }
    }

    /// Rows `idx` of `src` (quantised for the same route), in that order, as this one's rows.
    /// Panics past the capacity or past `src`'s rows.
    pub(crate) fn gather(&mut self, src: &QuantA, idx: impl Iterator<Item = usize>) {
        assert!(src.k == self.k && src.stride == self.stride, "int8: gathering rows of {} values into rows of {}", src.k, self.k);
        let stride = self.stride;
        self.scale.clear();
        self.zero.clear();
        let mut n = 0;
        for i in idx {
            assert!(n < self.capacity && i < src.rows, "int8: row {i} of {} gathered as row {n} of {}", src.rows, self.capacity);
            self.bytes_mut()[n * stride..(n + 1) * stride].copy_from_slice(&src.bytes()[i * stride..(i + 1) * stride]);
            self.scale.push(src.scale[i]);
            self.zero.push(src.zero[i]);
            n += 1;
        }
        self.rows = n;
    }
}

/// The rows of `x` (n × k) quantised, by the code of `route` (every route rounds alike).
pub fn quantise_activations(x: &[f32], n: usize, k: usize, route: Route) -> QuantA {
    assert!(x.len() >= n * k, "int8: {} activations for {n}x{k}", x.len());
    quantise_rows_by(n, k, route, |i, out| quantise_row_on(route, &x[i * k..(i + 1) * k], out))
}

/// [`quantise_activations`] of rows that `rows(i, f)` makes and hands to `f` (once), each
/// quantised while it is in L1: a LayerNorm's output (`LayerNormOp::with_row`), which is then
/// never stored as f32.
pub(crate) fn quantise_rows_with(n: usize, k: usize, route: Route, rows: impl Fn(usize, &mut dyn FnMut(&[f32])) + Sync) -> QuantA {
    quantise_rows_by(n, k, route, |i, out| {
        let mut sz = None;
        rows(i, &mut |row| sz = Some(quantise_row_on(route, &row[..k], out)));
        sz.expect("int8: a row not handed over")
    })
}

/// n rows quantised by `quantise(i, out)` (row i into its `out`, returning its scale and zero
/// point), laid out for `route`.
fn quantise_rows_by(n: usize, k: usize, route: Route, quantise: impl Fn(usize, &mut [u8]) -> (f32, i32) + Sync) -> QuantA {
    let stride = route.stride(k);
    let rows = if route.tiles() { n + tiles::MR } else { n };
    let mut a = QuantA { data: Lines::zeros(0), rows: n, capacity: n, k, stride, scale: Vec::new(), zero: Vec::new() };
    let mut sz = vec![(1f32, 0i32); n];
    let words = (rows * stride).div_ceil(4);
    // SAFETY: every word is written: each row's (zeroed, then its values) by its task, and the
    // rows after the last (the tiles' padding) and the last word's tail bytes zeroed here.
    unsafe {
        a.data.fill_uninit(words, |p| {
            let p = crate::simd::SendPtr(p as *mut f32);
            if stride > 0 {
                sz.par_iter_mut().enumerate().for_each(|(i, sz)| {
                    // Row i's bytes, this task's alone; zeroed first (the pad past k stays
                    // so, and meets zero weights), so the slice is initialised.
                    let row = (p.get() as *mut u8).add(i * stride);
                    std::ptr::write_bytes(row, 0, stride);
                    let out = std::slice::from_raw_parts_mut(row, stride);
                    *sz = quantise(i, out);
                });
            }
            let start = n * stride;
            std::ptr::write_bytes((p.get() as *mut u8).add(start), 0, words * 4 - start);
        });
    }
    (a.scale, a.zero) = sz.into_iter().unzip();
    a
}

/// [`quantise_row`] by the code of `route`.
pub(in crate::model::cpu) fn quantise_row_on(route: Route, x: &[f32], out: &mut [u8]) -> (f32, i32) {
    match route {
        // SAFETY: the route is AVX512-VNNI (with BW and VL) only where the CPU has it
        // (`route`, `isa::vnni`); AMX only at the AMX level, above AVX512-BF16's.
        #[cfg(target_arch = "x86_64")]
        Route::Avx512Vnni | Route::Amx => unsafe { quantise_row_avx512(x, out) },
        // SAFETY: the route is AVX-VNNI (with AVX2 and FMA) only where the CPU has it.
        #[cfg(target_arch = "x86_64")]
        Route::AvxVnni => unsafe { quantise_row_avx2(x, out) },
        _ => quantise_row(x, out),
    }
}

/// [`quantise_row`] compiled for AVX-512, its range by `vminps`/`vmaxps` on four pairs of
/// accumulators (the compiler's form of the lane-wise loop shuffled and moved masks, and took
/// two thirds of the time: 1800 × 4096 quantised in 1.7 ms). The same minimum and maximum: each
/// instruction applies the loop's rule, and neither ever takes a NaN, so the order of the
/// reductions does not matter.
///
/// # Safety
/// The CPU has AVX-512F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn quantise_row_avx512(x: &[f32], out: &mut [u8]) -> (f32, i32) {
    // SAFETY: the caller's promise.
    let (lo, hi) = unsafe { range_avx512(x) };
    let (s, inv, z) = range_scale(lo, hi);
    let n = x.len().min(out.len());
    // SAFETY: the caller's promise (AVX-512F and BW); the first n floats of x and bytes of out.
    unsafe { to_u8_avx512(x.as_ptr(), out.as_mut_ptr(), n, inv, z as f32) };
    (s, z)
}

/// [`to_u8`] of n floats into n bytes, 16 lanes at a time, the tail masked: the loop of
/// [`quantise_in_range`] as the compiler vectorised it ran its last (up to 63) values one by
/// one, all of the refiner's rows of 32 channels. The same bytes: `vrndscaleps` rounds half to
/// even as [`round_even`] does below 2²² (beyond, both clamp), and `vmaxps(t, 0)` sends NaN to
/// 0 as `to_u8`'s comparison does.
///
/// # Safety
/// x holds n readable floats, out n writable bytes; the CPU has AVX-512F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn to_u8_avx512(x: *const f32, out: *mut u8, n: usize, inv: f32, z: f32) {
    use core::arch::x86_64::*;
    let (inv, z, top, zero) = (_mm512_set1_ps(inv), _mm512_set1_ps(z), _mm512_set1_ps(255.0), _mm512_setzero_ps());
    for i in (0..n).step_by(16) {
        let m = crate::simd::avx512::masks(n - i).0;
        // SAFETY: the mask's lanes are floats i.. of x and bytes i.. of out (the caller's
        // promise); the others are neither read nor written.
        unsafe {
            let v = _mm512_maskz_loadu_ps(m, x.add(i));
            let t = _mm512_add_ps(_mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(v, inv)), z);
            let t = _mm512_min_ps(_mm512_max_ps(t, zero), top);
            _mm512_mask_cvtepi32_storeu_epi8(out.add(i) as *mut _, m, _mm512_cvttps_epi32(t));
        }
    }
}

/// [`row_range`] by `vminps`/`vmaxps` ([`quantise_row_avx512`]).
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn range_avx512(x: &[f32]) -> (f32, f32) {
    use core::arch::x86_64::*;
    let zero = _mm512_setzero_ps();
    let (mut lo, mut hi) = ([zero; 4], [zero; 4]);
    let wide = x.chunks_exact(64);
    let rest = wide.remainder();
    for c in wide {
        for j in 0..4 {
            // SAFETY: 16 of the chunk's 64 floats.
            let v = unsafe { _mm512_loadu_ps(c.as_ptr().add(16 * j)) };
            // min_ps(a, b) is `a < b ? a : b`, max_ps(a, b) `a > b ? a : b`: the loop's rules.
            lo[j] = _mm512_min_ps(v, lo[j]);
            hi[j] = _mm512_max_ps(v, hi[j]);
        }
    }
    for c in rest.chunks(16) {
        let m = crate::simd::avx512::masks(c.len()).0;
        // SAFETY: the mask's lanes are the chunk's floats; the others are not read (0 instead,
        // which the range holds anyway).
        let v = unsafe { _mm512_maskz_loadu_ps(m, c.as_ptr()) };
        lo[0] = _mm512_min_ps(v, lo[0]);
        hi[0] = _mm512_max_ps(v, hi[0]);
    }
    let lo = _mm512_reduce_min_ps(_mm512_min_ps(_mm512_min_ps(lo[0], lo[1]), _mm512_min_ps(lo[2], lo[3])));
    let hi = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(hi[0], hi[1]), _mm512_max_ps(hi[2], hi[3])));
    (lo, hi)
}

/// [`quantise_row`] compiled for AVX2.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantise_row_avx2(x: &[f32], out: &mut [u8]) -> (f32, i32) {
    quantise_row(x, out)
}

/// `x` (n × k) quantised per row and dequantised, as f32: the emulated route's activations.
pub fn fake_quantised(x: &[f32], n: usize, k: usize) -> Vec<f32> {
    let a = quantise_activations(x, n, k, Route::Emulated);
    let mut y = vec![0f32; n * k];
    if k > 0 {
        y.par_chunks_mut(k).enumerate().for_each(|(i, y)| {
            let (s, z) = (a.scale[i], a.zero[i]);
            y.iter_mut().zip(&a.bytes()[i * a.stride..]).for_each(|(y, &u)| *y = (u as i32 - z) as f32 * s);
        });
    }
    y
}

/// Rows of C per block: its A rows (block × K bytes) stay in L2 while the block's panels pass.
const ROW_TILES_PER_BLOCK: usize = 8;
/// Weight panels per block.
const PANELS_PER_BLOCK: usize = 4;

/// y (n × b.n()) = the int8 product of x (n × b.k()) and the weights, plus `bias`, on a VNNI
/// route (weights packed as [`Store::Panels`]); `None` for the emulated route, which the caller
/// runs as an f32 product on [`fake_quantised`] activations.
pub fn product(x: &[f32], n: usize, b: &QuantB, bias: &[f32], gelu: Option<Isa>) -> Option<Vec<f32>> {
    let Store::Panels { route, .. } = &b.store else { return None };
    Some(product_of(&quantise_activations(x, n, b.k, *route), b, bias, gelu))
}

/// [`product`] of n rows of k that `rows(i, f)` hands to `f` ([`quantise_rows_with`]).
pub(crate) fn product_of_rows(n: usize, b: &QuantB, bias: &[f32], gelu: Option<Isa>, rows: impl Fn(usize, &mut dyn FnMut(&[f32])) + Sync) -> Option<Vec<f32>> {
    let Store::Panels { route, .. } = &b.store else { return None };
    Some(product_of(&quantise_rows_with(n, b.k, *route, rows), b, bias, gelu))
}

/// [`product`] of rows quantised for b's route.
fn product_of(a: &QuantA, b: &QuantB, bias: &[f32], gelu: Option<Isa>) -> Vec<f32> {
    let Store::Panels { route, .. } = &b.store else { unreachable!("int8: rows quantised for the emulated route") };
    let n = a.rows;
    let mut y: Vec<f32> = Vec::with_capacity(n * b.n);
    // SAFETY: y has room for n × b.n values, written only here; `a` was quantised for b's route.
    unsafe { product_quantised(a, b, bias, MatMut::from_mut_ptr(y.as_mut_ptr(), n, b.n, b.n), gelu.is_some(), true) };
    // SAFETY: `product_quantised` wrote every element of C.
    unsafe { y.set_len(n * b.n) };
    // The other routes' GELU, in one pass after (the tiles applied theirs: the same function
    // on the same values, so the same bits).
    if let (Some(level), false) = (gelu, route.tiles()) {
        y.par_chunks_mut(4096).for_each(|c| crate::simd::math::gelu_in_place(level, c));
    }
    y
}

/// C (a.rows × b.n()) = the int8 product of the quantised rows `a` and the weights, plus
/// `bias` (and the GELU on the tile routes, where `gelu`), every element written; its blocks on
/// rayon where `parallel`, else on this thread. Panics on the emulated route's weights, or rows
/// quantised for another route.
///
/// # Safety
/// C is a writable a.rows × b.n() block that nothing else touches meanwhile.
pub unsafe fn product_quantised(a: &QuantA, b: &QuantB, bias: &[f32], c: MatMut<f32>, gelu: bool, parallel: bool) {
    let Store::Panels { route, words, colsum } = &b.store else { panic!("int8: the emulated route has no int8 product") };
    let (route, d_out, k, n) = (*route, b.n, b.k, a.rows);
    assert!(bias.len() == d_out, "int8: {} biases for {d_out} outputs", bias.len());
    assert!(a.k == k && a.stride == route.stride(k) && c.rows() == n && c.cols() == d_out, "int8: rows of {} for a {d_out}x{k} weight", a.k);
    // A tile reads whole tiles of rows past the last (`quantise_activations`, `QuantA::with_rows`).
    assert!(a.bytes().len() >= (n + if route.tiles() { tiles::MR } else { 0 }) * a.stride, "int8: rows without their padding");
    let (nr, mr) = (route.nr(), route.mr());
    let panels = d_out.div_ceil(nr);
    let kq = route.quads(k);
    let mut bias_padded = bias.to_vec();
    bias_padded.resize(panels * nr, 0.0);
    let (mc, pc) = (mr * ROW_TILES_PER_BLOCK, PANELS_PER_BLOCK);
    struct Shared(MatMut<f32>);
    // SAFETY: the jobs write C only through disjoint (row block × panel block) rectangles.
    unsafe impl Sync for Shared {}
    let shared = Shared(c);
    let shared = &shared;
    let job = |(r0, p0): (usize, usize)| {
        let r1 = (r0 + mc).min(n);
        // Tiles of equal height (≤ MR): 20 rows as 10 + 10, not 12 + 8.
        let tiles = (r1 - r0).div_ceil(mr);
        let tile_at = |p: usize, t: usize| {
            let (j, nv) = (p * nr, (d_out - p * nr).min(nr));
            let (t0, t1) = (r0 + (r1 - r0) * t / tiles, r0 + (r1 - r0) * (t + 1) / tiles);
            Tile {
                a: &a.bytes()[t0 * a.stride..],
                lda: a.stride,
                kq,
                b: &words[p * kq * nr..(p + 1) * kq * nr],
                scale_a: &a.scale[t0..t1],
                zero_a: &a.zero[t0..t1],
                scale_b: &b.scale[j..j + nr],
                colsum: &colsum[j..j + nr],
                bias: &bias_padded[j..j + nr],
                gelu,
                c: shared.0.block(t0, j, t1 - t0, nv),
            }
        };
        // The block's tiles, panel by panel (a panel stays in L1 while the rows pass).
        let block = (p0..(p0 + pc).min(panels)).flat_map(|p| (0..tiles).map(move |t| (p, t))).map(|(p, t)| tile_at(p, t));
        // SAFETY: the panels were packed for this route, which the CPU has (`route`); the tiles'
        // slices hold what `Tile` promises (their rows of A, whole quads; one panel; NR scales,
        // sums and biases), and their blocks of C are inside C and this job's alone.
        unsafe {
            match route {
                // Also: A's rows are 64-byte multiples on a cache line with 32 rows of zeros
                // after the last, the panels whole tiles' quads on cache lines
                // (`quantise_activations`, `QuantB::for_route`).
                #[cfg(target_arch = "x86_64")]
                Route::Amx => tiles::run(&mut crate::simd::amx::Amx::new().expect("int8 tiles on a CPU without usable AMX"), block, true),
                Route::AmxEmulated => tiles::run(&mut crate::simd::tiles::Emulated::default(), block, false),
                #[cfg(target_arch = "x86_64")]
                Route::Avx512Vnni => block.for_each(|t| avx512vnni::kernel(&t)),
                #[cfg(target_arch = "x86_64")]
                Route::AvxVnni => block.for_each(|t| avxvnni::kernel(&t)),
                // Also: kq is a multiple of 4 (dotprod) or 2 (i8mm), `Route::quads`.
                #[cfg(target_arch = "aarch64")]
                Route::Dotprod => block.for_each(|t| neon::dotprod(&t)),
                #[cfg(target_arch = "aarch64")]
                Route::I8mm => block.for_each(|t| neon::i8mm(&t)),
                _ => unreachable!("int8: panels on the emulated route"),
            }
        }
    };
    let jobs = (0..n.div_ceil(mc)).flat_map(|r| (0..panels.div_ceil(pc)).map(move |p| (r * mc, p * pc)));
    if parallel {
        jobs.collect::<Vec<_>>().into_par_iter().with_max_len(1).for_each(job);
    } else {
        jobs.for_each(job);
    }
    // The jobs' rectangles cover every row and column of C once (row blocks of mc, panel
    // blocks of pc, each panel's nv columns), and each tile writes all its elements.
}

/// One register tile's operands (mv ≤ MR rows, one panel of NR columns).
struct Tile<'a> {
    /// From row 0 of the tile's A: mv rows of `lda` bytes, `kq` quads each.
    a: &'a [u8],
    lda: usize,
    kq: usize,
    /// The panel: kq · NR words.
    b: &'a [i32],
    /// Per row (mv).
    scale_a: &'a [f32],
    zero_a: &'a [i32],
    /// Per column of the panel (NR).
    scale_b: &'a [f32],
    colsum: &'a [i32],
    bias: &'a [f32],
    /// GELU after the bias (the tile routes apply it in their epilogue).
    gelu: bool,
    /// mv × nv (nv ≤ NR) of C, written whole.
    c: MatMut<f32>,
}

impl Tile<'_> {
    /// Whether the slices hold what the kernels read (`nr`: the route's panel width).
    fn holds(&self, nr: usize) -> bool {
        let mv = self.c.rows();
        self.scale_a.len() == mv
            && self.zero_a.len() == mv
            && (mv == 0 || self.a.len() >= (mv - 1) * self.lda + 4 * self.kq)
            && self.b.len() >= self.kq * nr
            && self.scale_b.len() >= nr
            && self.colsum.len() >= nr
            && self.bias.len() >= nr
            && self.c.cols() <= nr
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512vnni;
#[cfg(target_arch = "x86_64")]
mod avxvnni;
#[cfg(target_arch = "aarch64")]
mod neon;
mod tiles;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::test_values;

    /// The int8 maths in f64 from the quantised operands: what every route must give, up to
    /// f32 rounding of the last steps.
    fn reference(a: &QuantA, q: &[i8], sw: &[f32], bias: &[f32], n: usize, k: usize) -> Vec<f64> {
        let mut y = vec![0f64; a.rows * n];
        for i in 0..a.rows {
            for o in 0..n {
                let s: i64 = (0..k).map(|c| (a.bytes()[i * a.stride + c] as i64 - a.zero[i] as i64) * q[o * k + c] as i64).sum();
                y[i * n + o] = s as f64 * a.scale[i] as f64 * sw[o] as f64 + bias[o] as f64;
            }
        }
        y
    }

    fn routes() -> Vec<Route> {
        let mut r: Vec<Route> = isa::levels().map(route).collect();
        r.dedup();
        r
    }

    /// Shapes past every edge: one row, rows not a multiple of MR, columns not of NR, K not of
    /// 4, and ViT-S's fc2 (K = 1536).
    const SHAPES: &[(usize, usize, usize)] = &[(1, 1, 1), (1, 3, 5), (7, 33, 13), (12, 32, 16), (13, 17, 250), (49, 70, 385), (130, 40, 1536), (3, 100, 4099)];

    /// Every route this machine has against the f64 int8 reference, and against the f32 product
    /// within what 8 bits allow.
    #[test]
    fn every_route_matches_the_int8_reference() {
        let mut seed = 0x3c6e_f372_fe94_f82bu64;
        for &(m, n, k) in SHAPES {
            let mut x = test_values(&mut seed, m * k);
            // An outlier column and a row of zeros, as activations have.
            if k > 3 {
                (0..m).for_each(|i| x[i * k + 3] *= 20.0);
            }
            x[..k].fill(0.0);
            let w = test_values(&mut seed, n * k);
            let bias = test_values(&mut seed, n);
            let (sw, q) = quantise_weights(&w, n, k);
            // The VNNI routes' sums are exact and their epilogues the same operations: the
            // same bits on each.
            let mut vnni: Option<(Route, Vec<f32>)> = None;
            // Each level's weights, and the tile route on the tiles' emulation (every machine).
            let builds =
                isa::levels().map(|l| (l.name(), QuantB::from_f32_nk(&w, n, k, l))).chain([("amx-emulated", QuantB::for_route(&w, n, k, Route::AmxEmulated))]);
            for (level, b) in builds {
                let r = b.route();
                let a = quantise_activations(&x, m, k, r);
                let want = reference(&a, &q, &sw, &bias, n, k);
                let got = match product(&x, m, &b, &bias, None) {
                    Some(y) => y,
                    None => {
                        // The emulated route: the f32 product of the dequantised operands.
                        let (xa, Store::Dequantised(wd)) = (fake_quantised(&x, m, k), b.store()) else { panic!("{r:?}: no weights") };
                        (0..m * n).map(|e| (0..k).map(|c| xa[e / n * k + c] * wd[e % n * k + c]).sum::<f32>() + bias[e % n]).collect()
                    }
                };
                if r != Route::Emulated {
                    match &vnni {
                        Some((r0, y0)) => assert!(y0.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{r0:?} and {r:?} differ at {m}x{n}x{k}"),
                        None => vnni = Some((r, got.clone())),
                    }
                }
                let mag = want.iter().fold(1e-3f64, |s, v| s.max(v.abs()));
                for (e, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert!((g as f64 - w).abs() <= 2e-6 * mag * (k as f64).sqrt(), "{level} {r:?} {m}x{n}x{k} [{e}]: {g} vs {w}");
                }
                // Against the unquantised product: each term off by at most half a step of each
                // operand.
                for i in 0..m {
                    for o in 0..n {
                        let exact: f64 = (0..k).map(|c| x[i * k + c] as f64 * w[o * k + c] as f64).sum::<f64>() + bias[o] as f64;
                        let bound: f64 = (0..k)
                            .map(|c| {
                                0.5 * a.scale[i] as f64 * (w[o * k + c].abs() as f64 + 0.5 * sw[o] as f64) + 0.5 * sw[o] as f64 * x[i * k + c].abs() as f64
                            })
                            .sum();
                        let g = got[i * n + o] as f64;
                        assert!((g - exact).abs() <= bound + 1e-4, "{level} {r:?} {m}x{n}x{k} [{i},{o}]: {g} vs {exact} (bound {bound})");
                    }
                }
            }
        }
        assert!(!routes().is_empty());
    }

    /// With the GELU asked for, every route (the tiles in their epilogue, the others in a pass
    /// after) gives the bits of the GELU applied to its product without it; the hardware
    /// tiles' vector GELU (`simd::avx512::gelu16`) within 2e-6 of it.
    #[test]
    fn the_gelu_is_applied_alike_on_every_route() {
        let mut seed = 0x6a09_e667_f3bc_c908u64;
        let (m, n, k) = (45, 70, 200);
        let x = test_values(&mut seed, m * k);
        let w = test_values(&mut seed, n * k);
        let bias = test_values(&mut seed, n);
        let builds = isa::levels().map(|l| QuantB::from_f32_nk(&w, n, k, l)).chain([QuantB::for_route(&w, n, k, Route::AmxEmulated)]);
        for b in builds {
            let (Some(plain), Some(gelu)) = (product(&x, m, &b, &bias, None), product(&x, m, &b, &bias, Some(isa::max()))) else { continue };
            let mut worst = 0f64;
            for (e, (&p, &g)) in plain.iter().zip(&gelu).enumerate() {
                let want = crate::simd::math::gelu(p);
                if b.route() == Route::Amx {
                    let err = (g - want).abs() as f64 / (want.abs().max(p.abs()) as f64).max(1e-30);
                    worst = worst.max(err);
                    assert!(err <= 2e-6, "{:?} [{e}]: gelu({p}) {g} vs {want}", b.route());
                } else {
                    assert_eq!(want.to_bits(), g.to_bits(), "{:?} [{e}]", b.route());
                }
            }
            eprintln!("{:?}: worst relative difference {worst:.1e}", b.route());
        }
    }

    /// Every route quantises activations to the same bytes (they share the code; the wide
    /// builds must not round differently), and the zero point maps 0 to itself.
    #[test]
    fn activations_quantise_alike_on_every_route() {
        let mut seed = 0x510e_527f_ade6_82d1u64;
        let (m, k) = (9, 301);
        let mut x = test_values(&mut seed, m * k);
        x[k..2 * k].iter_mut().for_each(|v| *v = v.abs());
        // Values the range must skip or keep as the scalar rules do: NaN, −0, one extreme in
        // the last partial vector.
        x[2 * k + 5] = f32::NAN;
        x[2 * k + 6] = -0.0;
        x[3 * k - 1] = -40.0;
        // Ties: a row over [0, 255] has scale 1, and its halves round to even.
        x[4 * k..5 * k].iter_mut().enumerate().for_each(|(c, v)| *v = if c == 0 { 255.0 } else { (c % 255) as f32 + 0.5 });
        x[5 * k - 1] = 0.0;
        let base = quantise_activations(&x, m, k, Route::Emulated);
        for r in routes().into_iter().chain([Route::AmxEmulated]) {
            let a = quantise_activations(&x, m, k, r);
            assert_eq!((&a.scale, &a.zero), (&base.scale, &base.zero), "{r:?}");
            for i in 0..m {
                // The rows' k bytes alike, and their padding (to the route's stride) zero.
                let (row, want) = (&a.bytes()[i * a.stride..(i + 1) * a.stride], &base.bytes()[i * base.stride..i * base.stride + k]);
                assert_eq!(&row[..k], want, "{r:?} row {i}");
                assert!(row[k..].iter().all(|&b| b == 0), "{r:?} row {i}: padding");
            }
        }
        assert_eq!((base.scale[4], base.zero[4]), (1.0, 0));
        assert_eq!(&base.bytes()[4 * base.stride..][..4], &[255, 2, 2, 4], "halves to even");
        // A row of non-negative values has its zero point at 0 and its maximum at 255.
        assert_eq!(base.zero[1], 0);
        assert_eq!(base.bytes()[base.stride..base.stride + k].iter().max(), Some(&255));
        for i in 0..m {
            let (s, z) = (base.scale[i], base.zero[i]);
            for c in 0..k {
                let (byte, v) = (base.bytes()[i * base.stride + c], x[i * k + c]);
                if v.is_nan() {
                    assert_eq!(byte, 0, "NaN at [{i},{c}]");
                    continue;
                }
                let back = (byte as i32 - z) as f32 * s;
                assert!((back - v).abs() <= 0.5001 * s, "[{i},{c}]");
            }
        }
    }

    /// Per-channel weights: the largest of each channel is ±127 and every value within half a
    /// step; a channel of zeros stays zero.
    #[test]
    fn weights_quantise_per_channel() {
        let mut seed = 0x9b05_688c_2b3e_6c1fu64;
        let (n, k) = (5, 77);
        let mut w = test_values(&mut seed, n * k);
        w[2 * k..3 * k].fill(0.0);
        w[4 * k..].iter_mut().for_each(|v| *v *= 1e-3);
        let (s, q) = quantise_weights(&w, n, k);
        for o in 0..n {
            let row = &q[o * k..(o + 1) * k];
            if o == 2 {
                assert!(row.iter().all(|&v| v == 0));
                continue;
            }
            assert_eq!(row.iter().map(|v| v.unsigned_abs()).max(), Some(127), "channel {o}");
            for c in 0..k {
                assert!((row[c] as f32 * s[o] - w[o * k + c]).abs() <= 0.5001 * s[o]);
            }
        }
        // Dequantised and quantised again: the same values.
        let back: Vec<f32> = q.iter().enumerate().map(|(e, &v)| v as f32 * s[e / k]).collect();
        assert_eq!(quantise_weights(&back, n, k).1, q);
    }
}
