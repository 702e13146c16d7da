//! The direct route's kernels: AVX-512F (f32 FMA) and AVX512-BF16 (bf16 pair dot products,
//! and the pair conversion of the slab), sharing a prologue (`start!`, also the one-tap
//! kernel's, in `crate::simd::avx512`) and an epilogue.
//!
//! The f32 kernels run only on the `Isa::Avx512` direct route and the bf16 ones on
//! `Isa::Avx512Bf16` (`super::route`), which `crate::simd::isa` gives only where the CPU has
//! them.

use core::arch::x86_64::*;

use crate::simd::avx512::{masks, start};
use crate::simd::{MatMut, MatRef};

// The kernels' epilogue, shared as a macro: as a function (even `#[inline]` with the same
// target features) it was not inlined and cost 50 % of the conv time.

/// C rows = acc [+ residual rows], masked to the first `nv` of 32 columns. `$c` is a
/// `MatMut<f32>` and `$add` an `Option<MatRef<f32>>` of the accumulators' rows, whose first
/// `$nv` floats are there (the kernels' callers' promise).
macro_rules! store {
    ($acc:ident, $add:ident, $c:ident, $nv:ident) => {{
        let (m0, m1) = masks($nv);
        for (r, acc) in $acc.iter_mut().enumerate() {
            let cr = $c.row(r);
            // SAFETY: the masks cover the first nv floats of row r, which `$c` and `$add` hold;
            // masked-off lanes are neither read nor written (nor can they fault).
            unsafe {
                if let Some(add) = $add {
                    let ar = add.row(r);
                    acc[0] = _mm512_add_ps(acc[0], _mm512_maskz_loadu_ps(m0, ar));
                    acc[1] = _mm512_add_ps(acc[1], _mm512_maskz_loadu_ps(m1, ar.wrapping_add(16)));
                }
                _mm512_mask_storeu_ps(cr, m0, acc[0]);
                _mm512_mask_storeu_ps(cr.wrapping_add(16), m1, acc[1]);
            }
        }
    }};
}

/// The pairs bf16(a[j]) | bf16(b[j]) << 16 (after a ReLU when asked) of the 16 floats at `a`
/// and `b`, zero in the lanes off `m`.
///
/// # Safety
/// The lanes of `m` are readable at `a` and `b`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
unsafe fn pairs16(a: *const f32, b: *const f32, m: __mmask16, relu: bool) -> __m512i {
    // SAFETY: the caller's promise for the masked loads (masked-off lanes are neither read nor
    // can fault); the transmutes change only the type of 32 bytes, every pattern of which is
    // valid.
    unsafe {
        let (mut va, mut vb) = (_mm512_maskz_loadu_ps(m, a), _mm512_maskz_loadu_ps(m, b));
        if relu {
            va = _mm512_max_ps(va, _mm512_setzero_ps());
            vb = _mm512_max_ps(vb, _mm512_setzero_ps());
        }
        let lo = core::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(va));
        let hi = core::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(vb));
        _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(hi)))
    }
}

/// dst[i] = bf16(a[i]) | bf16(b[i]) << 16 (after a ReLU when asked), for i below the three
/// lengths.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) fn pairs(a: &[f32], b: &[f32], relu: bool, dst: &mut [u32]) {
    let n = dst.len().min(a.len()).min(b.len());
    let mut i = 0;
    while i < n {
        let m: __mmask16 = if n - i >= 16 { 0xffff } else { ((1u32 << (n - i)) - 1) as u16 };
        // SAFETY: the mask keeps the loads and the store to i..min(i + 16, n), inside the three
        // slices (masked-off lanes are neither read nor written, nor can they fault).
        unsafe {
            let word = pairs16(a.as_ptr().add(i), b.as_ptr().add(i), m, relu);
            _mm512_mask_storeu_epi32(dst.as_mut_ptr().add(i) as *mut _, m, word);
        }
        i += 16;
    }
}

/// `super::pairs3`: the row's pairs E(c) = P(min(c, w − 1)) a vector at a time, the side
/// copies shifted in registers from E's neighbouring vectors (`valignd`), each stored with the
/// lanes past w zeroed: one conversion of the row for the three copies.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) fn pairs3(a: &[f32], b: &[f32], relu: bool, dst: [&mut [u32]; 3]) {
    let w = a.len().min(b.len());
    // SAFETY: `copies3` asks for columns i..i + 16 masked to w, inside `a` and `b` (masked-off
    // lanes are neither read nor can fault).
    copies3(w, dst, |i, m| unsafe { pairs16(a.as_ptr().add(i), b.as_ptr().add(i), m, relu) });
}

/// `super::quads3`: as [`pairs3`], the words of four channels' u8 ([`quads16`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) fn quads3(rows: [&[f32]; 4], relu: bool, inv: f32, zero: i32, dst: [&mut [u32]; 3]) {
    let w = rows.iter().map(|r| r.len()).min().unwrap_or(0);
    let ptrs = rows.map(<[f32]>::as_ptr);
    // SAFETY: as `pairs3`'s, for the four rows.
    copies3(w, dst, |i, m| unsafe { quads16(ptrs.map(|p| p.add(i)), m, relu, inv, zero) });
}

/// The words of 16 columns of four channels, channel j's u8 in byte j: `to_u8(v, inv, zero)`
/// of each value v (after a ReLU when asked), zero in the lanes off `m`. v · inv is held below
/// 256 before it is rounded, so that +∞ gives 255; −∞ and NaN give `cvtps2dq`'s i32::MIN
/// (`minps` returns its second operand where one is NaN), which saturates to 0, as `to_u8`'s.
/// The ReLU needs no instruction: its zero point is 0 (the range starts at 0), and a negative
/// value saturates to 0 as its ReLU would.
///
/// # Safety
/// The lanes of `m` are readable at each of `rows`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn quads16(rows: [*const f32; 4], m: __mmask16, relu: bool, inv: f32, zero: i32) -> __m512i {
    debug_assert!(!relu || zero == 0);
    let (inv, z, top) = (_mm512_set1_ps(inv), _mm512_set1_epi32(zero), _mm512_set1_ps(256.0));
    let q = rows.map(|r| {
        // SAFETY: the caller's promise for the masked loads.
        let v = unsafe { _mm512_maskz_loadu_ps(m, r) };
        _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_min_ps(top, _mm512_mul_ps(v, inv))), z)
    });
    _mm512_maskz_mov_epi32(m, words4(q))
}

/// The words of 16 pixels' four channels, channel j's byte j, from each channel's i32 values
/// saturated to u8 (below 0 to 0, above 255 to 255).
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
pub(super) fn words4(q: [__m512i; 4]) -> __m512i {
    // Saturated to u16 then u8: each 128-bit lane holds pixels 4l..4l + 4 of channel 0, then
    // of channels 1, 2, 3 (bytes 4j + i); the shuffle turns it to pixel-major words.
    let bytes = _mm512_packus_epi16(_mm512_packus_epi32(q[0], q[1]), _mm512_packus_epi32(q[2], q[3]));
    _mm512_shuffle_epi8(bytes, _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15)))
}

/// A row of words E(c) = F(min(c, w − 1)) as three copies of `n` words each (n the shortest
/// of `dst`): `dst[kx][c]` = E(c + kx − 1) (E(−1) = E(0)) for c < w, 0 for w ≤ c < n, where
/// `make(i, m)` gives F of columns i..i + 16 in the lanes of `m` (columns below w).
#[target_feature(enable = "avx512f")]
#[inline]
fn copies3(w: usize, dst: [&mut [u32]; 3], mut make: impl FnMut(usize, __mmask16) -> __m512i) {
    let n = dst.iter().map(|d| d.len()).min().unwrap_or(0);
    if w == 0 {
        return;
    }
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    // E's vector from column i: F of columns i.. (masked to w), the lanes past w replaced by
    // column w − 1's (the vector holding it is the last made: `last`).
    let mut last = _mm512_setzero_si512();
    let mut e_at = |i: usize| -> __m512i {
        if i >= w {
            return last;
        }
        let m: __mmask16 = if w - i >= 16 { 0xffff } else { ((1u32 << (w - i)) - 1) as u16 };
        let v = make(i, m);
        if w - i > 16 {
            return v;
        }
        // Lanes past column w − 1 take its word; `last` is its broadcast.
        let k = _mm512_set1_epi32((w - 1 - i) as i32);
        last = _mm512_permutexvar_epi32(k, v);
        _mm512_permutexvar_epi32(_mm512_min_epi32(lanes, k), v)
    };
    let mut cur = e_at(0);
    // E(−1) = E(0): column 0's word in every lane.
    let mut prev = _mm512_permutexvar_epi32(_mm512_setzero_si512(), cur);
    let [d0, d1, d2] = dst;
    let mut i = 0;
    while i < n {
        let next = e_at(i + 16);
        let keep: __mmask16 = if i >= w {
            0
        } else if w - i >= 16 {
            0xffff
        } else {
            ((1u32 << (w - i)) - 1) as u16
        };
        let store: __mmask16 = if n - i >= 16 { 0xffff } else { ((1u32 << (n - i)) - 1) as u16 };
        let rows = [_mm512_alignr_epi32::<15>(cur, prev), cur, _mm512_alignr_epi32::<1>(next, cur)];
        for (d, v) in [&mut *d0, &mut *d1, &mut *d2].into_iter().zip(rows) {
            // SAFETY: the store mask keeps the store to words i..min(i + 16, n), inside each
            // of the three rows (n is the shortest's length); masked-off lanes never fault.
            unsafe { _mm512_mask_storeu_epi32(d.as_mut_ptr().add(i) as *mut _, store, _mm512_maskz_mov_epi32(keep, v)) };
        }
        (prev, cur) = (cur, next);
        i += 16;
    }
}

/// C = bias + [add +] Σ_taps Σ_channels A · B_tap for one register tile of C (`c`, mv × nv,
/// mv ≤ 12, nv ≤ 32): A (`a`) the tile's weights, row r holding output channel r's taps one
/// after another, each over the channels (`b.rows()` words: bf16 pairs when `bf16`, else f32
/// bits); B_tap is `b` (the slab's channel rows, 32 readable words each whatever nv) moved on
/// by `taps[t]` words; `bias` holds mv values and `add` (mv × nv) is added at the end. The
/// dispatch on the arithmetic and on mv.
///
/// # Safety
/// The CPU has AVX512-BF16 when `bf16`, AVX-512F otherwise; every element of `a`, `bias` and
/// `add` is readable, B_tap's 32 words of each row for every tap, and every element of `c` is
/// writable.
#[inline]
pub(super) unsafe fn kernel(bf16: bool, a: MatRef<u32>, b: MatRef<u32>, taps: &[usize; 9], bias: *const f32, add: Option<MatRef<f32>>, c: MatMut<f32>) {
    debug_assert!(a.rows() == c.rows() && a.cols() == 9 * b.rows() && c.cols() <= 32);
    macro_rules! go {
        ($($r:literal)*) => {
            match c.rows() {
                // SAFETY: the caller's promise, passed on; R = mv.
                $($r => unsafe {
                    if bf16 {
                        kern::<$r>(a, b, taps, bias, add, c)
                    } else {
                        kern_f32::<$r>(a.cast(), b.cast(), taps, bias, add, c)
                    }
                },)*
                _ => unreachable!()
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12)
}

/// [`kernel`] in bf16 for R = mv rows: 32 pixels of one output row, as bf16 pairs. The same
/// register tile as the GEMM microkernel (R×2 zmm accumulators, 24 chains).
///
/// # Safety
/// As [`kernel`], with AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn kern<const R: usize>(a: MatRef<u32>, b: MatRef<u32>, taps: &[usize; 9], bias: *const f32, add: Option<MatRef<f32>>, c: MatMut<f32>) {
    let (lda, cs, cinp, nv) = (a.stride(), b.stride(), b.rows(), c.cols());
    let mut acc = start!(R, bias, add);
    for (t, &tap) in taps.iter().enumerate() {
        let at = a.at(0, t * cinp);
        let mut b = b.ptr().wrapping_add(tap);
        for cp in 0..cinp {
            // SAFETY: `b` is channel pair cp's row of this tap's B, 32 readable words, and
            // at.add(r · lda + cp) weight (r, t · cinp + cp) of A (the caller's promise); the
            // transmutes change only the type of 64 bytes, every pattern of which is valid.
            unsafe {
                let b0: __m512bh = core::mem::transmute(_mm512_loadu_si512(b as *const _));
                let b1: __m512bh = core::mem::transmute(_mm512_loadu_si512(b.add(16) as *const _));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let ar: __m512bh = core::mem::transmute(_mm512_set1_epi32(*at.add(r * lda + cp) as i32));
                    acc[0] = _mm512_dpbf16_ps(acc[0], ar, b0);
                    acc[1] = _mm512_dpbf16_ps(acc[1], ar, b1);
                }
            }
            // The next pair's row (past the last after the last: never read).
            b = b.wrapping_add(cs);
        }
    }
    store!(acc, add, c, nv);
}

/// [`kern`] in f32: one FMA per weight and pixel instead of a bf16 pair's dot product.
///
/// # Safety
/// As [`kernel`], with AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn kern_f32<const R: usize>(a: MatRef<f32>, b: MatRef<f32>, taps: &[usize; 9], bias: *const f32, add: Option<MatRef<f32>>, c: MatMut<f32>) {
    let (lda, cs, cin, nv) = (a.stride(), b.stride(), b.rows(), c.cols());
    let mut acc = start!(R, bias, add);
    for (t, &tap) in taps.iter().enumerate() {
        let at = a.at(0, t * cin);
        let mut b = b.ptr().wrapping_add(tap);
        for ci in 0..cin {
            // SAFETY: `b` is channel ci's row of this tap's B, 32 readable floats, and
            // at.add(r · lda + ci) weight (r, t · cin + ci) of A (the caller's promise).
            unsafe {
                let b0 = _mm512_loadu_ps(b);
                let b1 = _mm512_loadu_ps(b.add(16));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let ar = _mm512_set1_ps(*at.add(r * lda + ci));
                    acc[0] = _mm512_fmadd_ps(ar, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(ar, b1, acc[1]);
                }
            }
            // The next channel's row (past the last after the last: never read).
            b = b.wrapping_add(cs);
        }
    }
    store!(acc, add, c, nv);
}

/// A group of the tile route leaving its accumulator (`super::tiles`, rows of `g` floats): for
/// each of its mv output channels o, the nv pixels at `out + o · ldo` = bias[o] + acc[o]
/// [+ the residual's pixels at the same place, `res + o · ldo`], by masked AVX-512 loads and
/// stores (a scalar loop here was as slow as the tiles' products at 32 channels).
///
/// # Safety
/// The CPU has AVX-512F; `acc` holds mv rows of g ≥ nv floats, nv ≤ 32, `bias` mv floats; the
/// mv rows of nv floats at `out` are writable and at `res` (if any) readable.
// The group's shape, its sources and its destination, as the tile loop has them.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile_out(acc: &[f32], g: usize, mv: usize, nv: usize, bias: &[f32], res: Option<*const f32>, out: *mut f32, ldo: usize) {
    assert!(acc.len() >= mv * g && nv <= 32 && nv <= g && bias.len() >= mv, "tile_out: shapes");
    let (m0, m1) = masks(nv);
    for (o, &b) in bias.iter().enumerate().take(mv) {
        let b = _mm512_set1_ps(b);
        // SAFETY: row o of `acc` is g ≥ nv floats (asserted); the masks keep the loads of `res`
        // and the stores to `out` to row o's nv floats (the caller's promise); masked-off lanes
        // never fault.
        unsafe {
            let a = acc.as_ptr().add(o * g);
            let (mut v0, mut v1) = (_mm512_add_ps(b, _mm512_maskz_loadu_ps(m0, a)), _mm512_add_ps(b, _mm512_maskz_loadu_ps(m1, a.wrapping_add(16))));
            if let Some(r) = res {
                let r = r.wrapping_add(o * ldo);
                v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, r));
                v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, r.wrapping_add(16)));
            }
            let d = out.wrapping_add(o * ldo);
            _mm512_mask_storeu_ps(d, m0, v0);
            _mm512_mask_storeu_ps(d.wrapping_add(16), m1, v1);
        }
    }
}

/// An int8 tile route's accumulator row (`super::tiles`, at most 32 values) as f32, in place:
/// ((i32 bits) − `zs`) · `mul`.
#[target_feature(enable = "avx512f")]
pub(super) fn dequantise(row: &mut [f32], zs: i32, mul: f32) {
    assert!(row.len() <= 32, "dequantise: a row of {}", row.len());
    let (m0, m1) = masks(row.len());
    let (zs, mul) = (_mm512_set1_epi32(zs), _mm512_set1_ps(mul));
    for (i, m) in [(0, m0), (16, m1)] {
        // SAFETY: the mask keeps the load and the store to the row's values (asserted ≤ 32);
        // masked-off lanes are neither read nor written, nor can they fault.
        unsafe {
            let p = row.as_mut_ptr().wrapping_add(i);
            let v = _mm512_maskz_loadu_epi32(m, p as *const i32);
            _mm512_mask_storeu_ps(p, m, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(v, zs)), mul));
        }
    }
}

/// [`dequantise`] with each pixel's scale s[p] and zero point z[p] (`super::tiles`' one-tap
/// int8 ops): ((i32 bits) − z[p] · `sum`) · `scale_w` · s[p].
#[target_feature(enable = "avx512f")]
pub(super) fn dequantise_pixels(row: &mut [f32], sum: i32, scale_w: f32, s: &[f32], z: &[i32]) {
    assert!(row.len() <= 32 && s.len() >= row.len() && z.len() >= row.len(), "dequantise_pixels: shapes");
    let (m0, m1) = masks(row.len());
    let (sum, sw) = (_mm512_set1_epi32(sum), _mm512_set1_ps(scale_w));
    for (i, m) in [(0, m0), (16, m1)] {
        // SAFETY: the mask keeps every access to the row's values (asserted ≤ 32, and no more
        // than `s` and `z` hold); masked-off lanes are neither read nor written, nor can they
        // fault.
        unsafe {
            let p = row.as_mut_ptr().wrapping_add(i);
            let v = _mm512_maskz_loadu_epi32(m, p as *const i32);
            let zp = _mm512_maskz_loadu_epi32(m, z.as_ptr().wrapping_add(i));
            let sp = _mm512_maskz_loadu_ps(m, s.as_ptr().wrapping_add(i));
            let d = _mm512_cvtepi32_ps(_mm512_sub_epi32(v, _mm512_mullo_epi32(zp, sum)));
            _mm512_mask_storeu_ps(p, m, _mm512_mul_ps(d, _mm512_mul_ps(sw, sp)));
        }
    }
}

/// One output row of an upsampled convolution's group on the tile route (`super::tiles`, its
/// phases interleaved by column): out[2i] = bias + even[i], out[2i + 1] = bias + odd[i] for the
/// nv pixels i [+ the residual's 2·nv floats at the same place], where `even` and `odd` are the
/// accumulator rows of phases px = 0 and 1 of one output channel and output row. Two
/// `vpermt2ps` per 32 floats; before, a separate pass interleaved the phases' planes (60 MB
/// read and written at ViT-L's last level, 4.7-4.9 ms a call on an Intel Xeon with AMX).
///
/// # Safety
/// The CPU has AVX-512F; `even` and `odd` hold nv ≤ 32 floats each; the 2·nv floats at `out`
/// are writable and at `res` (if any) readable.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn phase_row_out(even: &[f32], odd: &[f32], nv: usize, bias: f32, res: Option<*const f32>, out: *mut f32) {
    assert!(nv <= 32 && even.len() >= nv && odd.len() >= nv, "phase_row_out: shapes");
    let (m0, m1) = masks(nv);
    let b = _mm512_set1_ps(bias);
    // Lanes 0..16 of the result from the 8 first of each source, alternating (the second
    // source's lanes are numbered from 16); `hi` the same from their last 8.
    let lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    // Output masks: 2·nv of 64 floats, 16 a vector.
    let (o0, o1) = masks((2 * nv).min(32));
    let (o2, o3) = masks((2 * nv).saturating_sub(32));
    // SAFETY: the masks keep every load to nv floats of `even` and `odd` and every load of
    // `res` and store to `out` to their 2·nv floats (the caller's promise); masked-off lanes
    // never fault.
    unsafe {
        let e = [_mm512_add_ps(b, _mm512_maskz_loadu_ps(m0, even.as_ptr())), _mm512_add_ps(b, _mm512_maskz_loadu_ps(m1, even.as_ptr().wrapping_add(16)))];
        let o = [_mm512_add_ps(b, _mm512_maskz_loadu_ps(m0, odd.as_ptr())), _mm512_add_ps(b, _mm512_maskz_loadu_ps(m1, odd.as_ptr().wrapping_add(16)))];
        let mut v = [
            _mm512_permutex2var_ps(e[0], lo, o[0]),
            _mm512_permutex2var_ps(e[0], hi, o[0]),
            _mm512_permutex2var_ps(e[1], lo, o[1]),
            _mm512_permutex2var_ps(e[1], hi, o[1]),
        ];
        let m = [o0, o1, o2, o3];
        for (q, v) in v.iter_mut().enumerate() {
            if let Some(r) = res {
                *v = _mm512_add_ps(*v, _mm512_maskz_loadu_ps(m[q], r.wrapping_add(16 * q)));
            }
            _mm512_mask_storeu_ps(out.wrapping_add(16 * q), m[q], *v);
        }
    }
}
