//! The row tiles (`rows.rs`) on AVX-512: 12 rows × 32 output channels in 24 zmm accumulators,
//! per unit of k two loads of the panel and one broadcast per row, as `matmul::bf16`'s
//! microkernel, but with every row of A and C at its own address. f32 on `vfmadd231ps`
//! (AVX-512F), bf16 pairs on `vdpbf16ps` (AVX512-BF16).
//!
//! Every function here needs the `#[target_feature]`s it names: `SubmConv3d` takes these tiles
//! only at the levels that have them (`crate::simd::isa`).

use core::arch::x86_64::*;

use super::rows::{Start, MR, NR};

/// Dispatches a multi-tap tile on its row count (1..=MR).
macro_rules! by_rows_multi {
    ($f:ident, $a:expr, $b:expr, $c:expr, $k:expr, $nv:expr, $s:expr) => {
        match $c.len() {
            1 => $f::<1>($a, $b, $c, $k, $nv, $s),
            2 => $f::<2>($a, $b, $c, $k, $nv, $s),
            3 => $f::<3>($a, $b, $c, $k, $nv, $s),
            4 => $f::<4>($a, $b, $c, $k, $nv, $s),
            5 => $f::<5>($a, $b, $c, $k, $nv, $s),
            6 => $f::<6>($a, $b, $c, $k, $nv, $s),
            7 => $f::<7>($a, $b, $c, $k, $nv, $s),
            8 => $f::<8>($a, $b, $c, $k, $nv, $s),
            9 => $f::<9>($a, $b, $c, $k, $nv, $s),
            10 => $f::<10>($a, $b, $c, $k, $nv, $s),
            11 => $f::<11>($a, $b, $c, $k, $nv, $s),
            12 => $f::<12>($a, $b, $c, $k, $nv, $s),
            _ => {}
        }
    };
}

/// Dispatches a tile on its row count (1..=MR), the accumulators of that many rows.
macro_rules! by_rows {
    ($f:ident, $a:expr, $b:expr, $c:expr, $k:expr, $nv:expr, $s:expr) => {
        match $a.len() {
            1 => $f::<1>($a, $b, $c, $k, $nv, $s),
            2 => $f::<2>($a, $b, $c, $k, $nv, $s),
            3 => $f::<3>($a, $b, $c, $k, $nv, $s),
            4 => $f::<4>($a, $b, $c, $k, $nv, $s),
            5 => $f::<5>($a, $b, $c, $k, $nv, $s),
            6 => $f::<6>($a, $b, $c, $k, $nv, $s),
            7 => $f::<7>($a, $b, $c, $k, $nv, $s),
            8 => $f::<8>($a, $b, $c, $k, $nv, $s),
            9 => $f::<9>($a, $b, $c, $k, $nv, $s),
            10 => $f::<10>($a, $b, $c, $k, $nv, $s),
            11 => $f::<11>($a, $b, $c, $k, $nv, $s),
            12 => $f::<12>($a, $b, $c, $k, $nv, $s),
            _ => {}
        }
    };
}

/// The masks of the first nv ≤ 32 lanes over two zmm of f32.
#[inline(always)]
fn masks(nv: usize) -> (__mmask16, __mmask16) {
    let m = if nv >= 32 { u32::MAX } else { (1u32 << nv) - 1 };
    (m as u16, (m >> 16) as u16)
}

/// `rows::Tile` for f32 rows. Kept apart from [`multi_f32`], whose loop it repeats for one tap:
/// as `multi_f32` over one tap the f32 sparse convolution ran at half the rate (70-85 against
/// 130-200 GMAC/s per level, `examples/sparse_conv_bench.rs`, an Intel Xeon with AMX at
/// `MOGE_MAX_CPU_ISA=avx512bf16`, 2026-12-07; bf16 unchanged).
///
/// # Safety
/// As `rows::Tile`; the CPU has AVX-512F.
pub unsafe fn tile_f32(a: &[*const f32], b: *const f32, c: &[*mut f32], k: usize, nv: usize, start: Start) {
    debug_assert!(a.len() == c.len() && a.len() <= MR && nv <= NR);
    // SAFETY: the caller's promise, passed on.
    unsafe { by_rows!(f32_rows, a, b, c, k, nv, start) }
}

/// # Safety
/// As [`tile_f32`], with R = a.len().
#[target_feature(enable = "avx512f")]
unsafe fn f32_rows<const R: usize>(a: &[*const f32], b: *const f32, c: &[*mut f32], k: usize, nv: usize, start: Start) {
    let a: [*const f32; R] = core::array::from_fn(|r| a[r]);
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for u in 0..k {
        // SAFETY: unit u of the panel (NR floats at u · NR) and of each row (the caller's
        // promise: k units each).
        unsafe {
            let b0 = _mm512_loadu_ps(b.add(u * NR));
            let b1 = _mm512_loadu_ps(b.add(u * NR + 16));
            for (acc, &ar) in acc.iter_mut().zip(&a) {
                let av = _mm512_set1_ps(*ar.add(u));
                acc[0] = _mm512_fmadd_ps(av, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(av, b1, acc[1]);
            }
        }
    }
    // SAFETY: the first nv floats of each c[r], of the bias and of each residual row (the
    // caller's promise); masked lanes are neither read nor written.
    unsafe { store(&acc, c, nv, start) }
}

/// `rows::Tile` for bf16 pair words.
///
/// # Safety
/// As `rows::Tile`; the CPU has AVX-512F, BW, VL and BF16.
pub unsafe fn tile_bf16(a: &[*const u32], b: *const u32, c: &[*mut f32], k: usize, nv: usize, start: Start) {
    debug_assert!(a.len() == c.len() && a.len() <= MR && nv <= NR);
    // SAFETY: the caller's promise, passed on.
    unsafe { by_rows!(bf16_rows, a, b, c, k, nv, start) }
}

/// # Safety
/// As [`tile_bf16`], with R = a.len().
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn bf16_rows<const R: usize>(a: &[*const u32], b: *const u32, c: &[*mut f32], k: usize, nv: usize, start: Start) {
    let a: [*const u32; R] = core::array::from_fn(|r| a[r]);
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for u in 0..k {
        // SAFETY: pair u of the panel (NR words at u · NR) and of each row (the caller's
        // promise); the transmutes change only the type of 64 bytes, every pattern of which is
        // a valid vector.
        unsafe {
            let b0: __m512bh = core::mem::transmute(_mm512_loadu_si512(b.add(u * NR) as *const _));
            let b1: __m512bh = core::mem::transmute(_mm512_loadu_si512(b.add(u * NR + 16) as *const _));
            for (acc, &ar) in acc.iter_mut().zip(&a) {
                let av: __m512bh = core::mem::transmute(_mm512_set1_epi32(*ar.add(u) as i32));
                acc[0] = _mm512_dpbf16_ps(acc[0], av, b0);
                acc[1] = _mm512_dpbf16_ps(acc[1], av, b1);
            }
        }
    }
    // SAFETY: as in `f32_rows`.
    unsafe { store(&acc, c, nv, start) }
}

/// `rows::MultiTile` for f32 rows.
///
/// # Safety
/// As `rows::MultiTile`; the CPU has AVX-512F.
pub unsafe fn multi_f32(a: &[[*const f32; MR]], b: &[*const f32], c: &[*mut f32], k: usize, nv: usize, start: Start) {
    debug_assert!(a.len() == b.len() && c.len() <= MR && nv <= NR);
    // SAFETY: the caller's promise, passed on.
    unsafe { by_rows_multi!(f32_multi, a, b, c, k, nv, start) }
}

/// # Safety
/// As [`multi_f32`], with R = c.len().
#[target_feature(enable = "avx512f")]
unsafe fn f32_multi<const R: usize>(a: &[[*const f32; MR]], b: &[*const f32], c: &[*mut f32], k: usize, nv: usize, start: Start) {
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for (at, &bt) in a.iter().zip(b) {
        let ar: [*const f32; R] = core::array::from_fn(|r| at[r]);
        for u in 0..k {
            // SAFETY: unit u of this tap's panel and of each row's input (the caller's promise).
            unsafe {
                let b0 = _mm512_loadu_ps(bt.add(u * NR));
                let b1 = _mm512_loadu_ps(bt.add(u * NR + 16));
                for (acc, &ar) in acc.iter_mut().zip(&ar) {
                    let av = _mm512_set1_ps(*ar.add(u));
                    acc[0] = _mm512_fmadd_ps(av, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(av, b1, acc[1]);
                }
            }
        }
    }
    // SAFETY: as in `f32_rows`.
    unsafe { store(&acc, c, nv, start) }
}

/// `rows::MultiTile` for bf16 pair words.
///
/// # Safety
/// As `rows::MultiTile`; the CPU has AVX-512F, BW, VL and BF16.
pub unsafe fn multi_bf16(a: &[[*const u32; MR]], b: &[*const u32], c: &[*mut f32], k: usize, nv: usize, start: Start) {
    debug_assert!(a.len() == b.len() && c.len() <= MR && nv <= NR);
    // SAFETY: the caller's promise, passed on.
    unsafe { by_rows_multi!(bf16_multi, a, b, c, k, nv, start) }
}

/// # Safety
/// As [`multi_bf16`], with R = c.len().
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn bf16_multi<const R: usize>(a: &[[*const u32; MR]], b: &[*const u32], c: &[*mut f32], k: usize, nv: usize, start: Start) {
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for (at, &bt) in a.iter().zip(b) {
        let ar: [*const u32; R] = core::array::from_fn(|r| at[r]);
        for u in 0..k {
            // SAFETY: pair u of this tap's panel and of each row's input (the caller's
            // promise); the transmutes as in `bf16_rows`.
            unsafe {
                let b0: __m512bh = core::mem::transmute(_mm512_loadu_si512(bt.add(u * NR) as *const _));
                let b1: __m512bh = core::mem::transmute(_mm512_loadu_si512(bt.add(u * NR + 16) as *const _));
                for (acc, &ar) in acc.iter_mut().zip(&ar) {
                    let av: __m512bh = core::mem::transmute(_mm512_set1_epi32(*ar.add(u) as i32));
                    acc[0] = _mm512_dpbf16_ps(acc[0], av, b0);
                    acc[1] = _mm512_dpbf16_ps(acc[1], av, b1);
                }
            }
        }
    }
    // SAFETY: as in `f32_rows`.
    unsafe { store(&acc, c, nv, start) }
}

/// `c[r][..nv] = start + acc[r]`.
///
/// # Safety
/// Each c[r] holds nv ≤ 32 writable floats (readable for [`Start::Add`]), the bias and each
/// residual row nv readable ones; the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store<const R: usize>(acc: &[[__m512; 2]; R], c: &[*mut f32], nv: usize, start: Start) {
    let (m0, m1) = masks(nv);
    // SAFETY (every block below): the masks cover the first nv floats of each row, the bias and
    // each residual row (the caller's promise); masked-off lanes are neither read nor written
    // (nor can they fault).
    match start {
        Start::Add => {
            for (acc, &cr) in acc.iter().zip(c) {
                // SAFETY: as above.
                unsafe {
                    let lo = _mm512_add_ps(acc[0], _mm512_maskz_loadu_ps(m0, cr));
                    let hi = _mm512_add_ps(acc[1], _mm512_maskz_loadu_ps(m1, cr.wrapping_add(16)));
                    _mm512_mask_storeu_ps(cr, m0, lo);
                    _mm512_mask_storeu_ps(cr.wrapping_add(16), m1, hi);
                }
            }
        }
        Start::From { bias, residual } => {
            // SAFETY: as above.
            let (b0, b1) = unsafe { (_mm512_maskz_loadu_ps(m0, bias), _mm512_maskz_loadu_ps(m1, bias.wrapping_add(16))) };
            for (r, (acc, &cr)) in acc.iter().zip(c).enumerate() {
                let (mut lo, mut hi) = (_mm512_add_ps(acc[0], b0), _mm512_add_ps(acc[1], b1));
                // SAFETY: as above.
                unsafe {
                    if let Some(res) = residual {
                        lo = _mm512_add_ps(lo, _mm512_maskz_loadu_ps(m0, res[r]));
                        hi = _mm512_add_ps(hi, _mm512_maskz_loadu_ps(m1, res[r].wrapping_add(16)));
                    }
                    _mm512_mask_storeu_ps(cr, m0, lo);
                    _mm512_mask_storeu_ps(cr.wrapping_add(16), m1, hi);
                }
            }
        }
    }
}

/// The AMX route's gather (`tiles.rs`): row i of `dst` (rows of `kw` words) = row `srcs[i]` of
/// `words`, or zeros where it is `ABSENT`.
///
/// # Safety
/// `dst` holds srcs.len() · kw writable words, `words` each source row's kw readable ones, kw a
/// multiple of 16; the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn gather_rows(dst: *mut u32, srcs: &[u32], words: *const u32, kw: usize) {
    for (i, &s) in srcs.iter().enumerate() {
        let d = dst.wrapping_add(i * kw);
        let src = words.wrapping_add(s as usize * kw);
        for w in (0..kw).step_by(16) {
            // SAFETY: words w..w + 16 of row i of `dst` and of the source row (the caller's
            // promise); an absent source is not read.
            unsafe {
                let v = if s == super::ABSENT { _mm512_setzero_si512() } else { _mm512_loadu_si512(src.add(w) as *const _) };
                _mm512_storeu_si512(d.add(w) as *mut _, v);
            }
        }
    }
}

/// The AMX route's outputs (`tiles.rs`): for each voxel v of `voxels` (row r of `c`, rows of 32
/// floats; `ABSENT`: none), `out[(v − v0)·co + o0..][..nv] = c[r] + bias [+ residual[v·co + o0..]]`.
///
/// # Safety
/// Those rows of `out` (writable) and of `residual` (unless null) exist, `c` holds the voxels'
/// rows, `bias` nv ≤ 32 floats; the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn finish_rows(
    out: *mut f32,
    (v0, co, o0, nv): (usize, usize, usize, usize),
    voxels: &[u32],
    c: *const f32,
    bias: *const f32,
    residual: *const f32,
) {
    let (m0, m1) = masks(nv);
    // SAFETY: the masks cover the bias's nv floats (the caller's promise); masked-off lanes are
    // not read. So below for each row of `c`, the residual and the outputs.
    let (b0, b1) = unsafe { (_mm512_maskz_loadu_ps(m0, bias), _mm512_maskz_loadu_ps(m1, bias.wrapping_add(16))) };
    for (r, &v) in voxels.iter().enumerate() {
        if v == super::ABSENT {
            continue;
        }
        let (v, cr) = (v as usize, c.wrapping_add(r * 32));
        let dst = out.wrapping_add((v - v0) * co + o0);
        // SAFETY: as above: rows r of `c`, v of the residual, v − v0 of `out` (the caller's).
        unsafe {
            let mut lo = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, cr), b0);
            let mut hi = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, cr.wrapping_add(16)), b1);
            if !residual.is_null() {
                let res = residual.wrapping_add(v * co + o0);
                lo = _mm512_add_ps(lo, _mm512_maskz_loadu_ps(m0, res));
                hi = _mm512_add_ps(hi, _mm512_maskz_loadu_ps(m1, res.wrapping_add(16)));
            }
            _mm512_mask_storeu_ps(dst, m0, lo);
            _mm512_mask_storeu_ps(dst.wrapping_add(16), m1, hi);
        }
    }
}

/// Rows of the int8 tile's passes: 6 rows × 32 channels take 12 int32 and 12 f32 accumulators
/// (a tap's sums are scaled into f32 before the next tap's, which reads other voxels).
const INT8_ROWS: usize = 6;

/// `rows::Tile` for int8 rows and panels (`rows.rs`'s documentation).
///
/// # Safety
/// As `rows::Tile`; the CPU has AVX-512F, BW, VL and VNNI.
pub unsafe fn tile_int8(a: &[*const u32], b: *const u32, c: &[*mut f32], k: usize, nv: usize, start: Start) {
    debug_assert!(a.len() == c.len() && a.len() <= MR && nv <= NR);
    let at: [*const u32; MR] = core::array::from_fn(|r| a.get(r).copied().unwrap_or(core::ptr::null()));
    // SAFETY: the caller's promise, for one tap.
    unsafe { multi_int8(&[at], &[b], c, k, nv, start) }
}

/// `rows::MultiTile` for int8 rows and panels, in passes of [`INT8_ROWS`] rows.
///
/// # Safety
/// As `rows::MultiTile`; the CPU has AVX-512F, BW, VL and VNNI.
pub unsafe fn multi_int8(a: &[[*const u32; MR]], b: &[*const u32], c: &[*mut f32], k: usize, nv: usize, start: Start) {
    debug_assert!(a.len() == b.len() && c.len() <= MR && nv <= NR && k >= super::rows::INT8_EXTRA);
    let mut h = 0;
    while h < c.len() {
        let rows = (c.len() - h).min(INT8_ROWS);
        let (c, start) = (&c[h..h + rows], start.skip(h));
        // SAFETY: the caller's promise, for rows h.. of every tap.
        unsafe {
            match rows {
                1 => int8_pass::<1>(a, h, b, c, k, nv, start),
                2 => int8_pass::<2>(a, h, b, c, k, nv, start),
                3 => int8_pass::<3>(a, h, b, c, k, nv, start),
                4 => int8_pass::<4>(a, h, b, c, k, nv, start),
                5 => int8_pass::<5>(a, h, b, c, k, nv, start),
                _ => int8_pass::<6>(a, h, b, c, k, nv, start),
            }
        }
        h += rows;
    }
}

/// Rows h..h + R of [`multi_int8`].
///
/// # Safety
/// As [`multi_int8`], c being those R rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn int8_pass<const R: usize>(a: &[[*const u32; MR]], h: usize, b: &[*const u32], c: &[*mut f32], k: usize, nv: usize, start: Start) {
    let quads = k - super::rows::INT8_EXTRA;
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for (at, &bt) in a.iter().zip(b) {
        let ar: [*const u32; R] = core::array::from_fn(|r| at[h + r]);
        let mut sums = [[_mm512_setzero_si512(); 2]; R];
        for u in 0..quads {
            // SAFETY: quad u of this tap's panel and of each row's input (the caller's promise).
            unsafe {
                let b0 = _mm512_loadu_si512(bt.add(u * NR) as *const _);
                let b1 = _mm512_loadu_si512(bt.add(u * NR + 16) as *const _);
                for (sums, &ar) in sums.iter_mut().zip(&ar) {
                    let av = _mm512_set1_epi32(*ar.add(u) as i32);
                    sums[0] = _mm512_dpbusd_epi32(sums[0], av, b0);
                    sums[1] = _mm512_dpbusd_epi32(sums[1], av, b1);
                }
            }
        }
        // acc += s · sums − s·z · Σ q_w: the scales after the row's quads, the tap's Σ q_w after
        // the panel's (the caller's promise: k units each).
        // SAFETY: as above.
        unsafe {
            let w0 = _mm512_loadu_ps(bt.add(quads * NR) as *const f32);
            let w1 = _mm512_loadu_ps(bt.add(quads * NR + 16) as *const f32);
            for ((acc, sums), &ar) in acc.iter_mut().zip(&sums).zip(&ar) {
                let s = _mm512_set1_ps(f32::from_bits(*ar.add(quads)));
                let sz = _mm512_set1_ps(f32::from_bits(*ar.add(quads + 1)));
                acc[0] = _mm512_fnmadd_ps(sz, w0, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(sums[0]), acc[0]));
                acc[1] = _mm512_fnmadd_ps(sz, w1, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(sums[1]), acc[1]));
            }
        }
    }
    // The weights' scales, every tap's panel holding them: tap 0's.
    // SAFETY: as above.
    unsafe {
        let s0 = _mm512_loadu_ps(b[0].add((quads + 1) * NR) as *const f32);
        let s1 = _mm512_loadu_ps(b[0].add((quads + 1) * NR + 16) as *const f32);
        for acc in acc.iter_mut() {
            acc[0] = _mm512_mul_ps(acc[0], s0);
            acc[1] = _mm512_mul_ps(acc[1], s1);
        }
    }
    // SAFETY: as in `f32_rows`.
    unsafe { store(&acc, c, nv, start) }
}
