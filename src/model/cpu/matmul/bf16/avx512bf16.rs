//! The AVX512-BF16 route of the bf16 GEMM: the microkernel and the vector packers.
//!
//! Every function here needs a CPU with AVX-512F, BW, VL and BF16 (its `#[target_feature]`s):
//! they are called only on the `Isa::Avx512Bf16` route (`super::route`), which
//! `crate::simd::isa` gives only where the CPU has it. The packers read checked views
//! ([`Mat`]`<&[f32]>`) and check what they write, so that CPU is all they need.

use super::NR;
use crate::simd::avx512::{gelu16, pow2, POW2_SHORT};
use crate::simd::{Mat, MatMut, MatRef};
use core::arch::x86_64::*;

/// C (mv × nv, mv ≤ [`super::MR`], nv ≤ NR) (+)= A · B over `a.cols()` k pairs: A (`a`) mv
/// rows of bf16 pairs, B (`b`) one panel (the k pairs' NR words one after another). The
/// dispatch on mv: tail panels get a smaller register tile instead of wasted multiply-adds on
/// zero rows.
///
/// # Safety
/// The CPU has AVX512-BF16; every element of `a` and `c` is readable (and writable), and `b`
/// holds `a.cols()` · NR readable words.
#[inline]
pub(super) unsafe fn kernel(a: MatRef<u32>, b: *const u32, c: MatMut<f32>, load_c: bool) {
    debug_assert!(a.rows() == c.rows() && c.cols() <= NR);
    macro_rules! go {
        ($($r:literal)*) => {
            // SAFETY: the caller's promise, passed on; R = mv.
            match c.rows() { $($r => unsafe { kern::<$r>(a, b, c, load_c) },)* _ => unreachable!() }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12)
}

/// [`kernel`] for R = mv rows.
///
/// # Safety
/// As [`kernel`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn kern<const R: usize>(a: MatRef<u32>, b: *const u32, c: MatMut<f32>, load_c: bool) {
    let (kps, lda, nv) = (a.cols(), a.stride(), c.cols());
    let m0: __mmask16 = if nv >= 16 { 0xffff } else { (1u32 << nv) as u16 - 1 };
    let m1: __mmask16 = if nv >= 32 {
        0xffff
    } else if nv > 16 {
        (1u32 << (nv - 16)) as u16 - 1
    } else {
        0
    };
    // C is added after the k loop, not loaded into the accumulators before it: the rows of
    // C are usually far apart (ldc of thousands) and not cached, so they are prefetched
    // here and arrive while the loop runs (~12 cycles per k pair) instead of stalling it.
    for r in 0..R {
        // A prefetch never faults.
        let cr = c.row(r) as *const i8;
        _mm_prefetch::<_MM_HINT_T0>(cr);
        _mm_prefetch::<_MM_HINT_T0>(cr.wrapping_add(64));
    }
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let (a, mut b) = (a.ptr(), b);
    for kp in 0..kps {
        // SAFETY: `b` is k pair kp's NR readable words and a.add(r · lda + kp) element (r, kp)
        // of A (the caller's promise); the transmutes change only the type of 64 bytes, every
        // pattern of which is a valid vector.
        unsafe {
            let b0: __m512bh = core::mem::transmute(_mm512_loadu_si512(b as *const _));
            let b1: __m512bh = core::mem::transmute(_mm512_loadu_si512(b.add(16) as *const _));
            for (r, acc) in acc.iter_mut().enumerate() {
                let ar: __m512bh = core::mem::transmute(_mm512_set1_epi32(*a.add(r * lda + kp) as i32));
                acc[0] = _mm512_dpbf16_ps(acc[0], ar, b0);
                acc[1] = _mm512_dpbf16_ps(acc[1], ar, b1);
            }
        }
        // The next pair's words (past the panel after the last: never read).
        b = b.wrapping_add(NR);
    }
    for (r, acc) in acc.iter_mut().enumerate() {
        let cr = c.row(r);
        // SAFETY: the masks cover the first nv floats of row r, which C holds; masked-off lanes
        // are neither read nor written (nor can they fault).
        unsafe {
            if load_c {
                acc[0] = _mm512_add_ps(acc[0], _mm512_maskz_loadu_ps(m0, cr));
                acc[1] = _mm512_add_ps(acc[1], _mm512_maskz_loadu_ps(m1, cr.add(16)));
            }
            _mm512_mask_storeu_ps(cr, m0, acc[0]);
            _mm512_mask_storeu_ps(cr.add(16), m1, acc[1]);
        }
    }
}

/// 32 consecutive f32 (masked: the first `n` of them, rest read as 0) → 16 bf16 pairs in order.
///
/// # Safety
/// The first min(n, 32) floats from `p` are readable (none need be for n = 0).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
unsafe fn cvt32(p: *const f32, n: usize) -> __m512i {
    // SAFETY: the loads read the first min(n, 32) floats (the caller's promise); masked-off
    // lanes are not read (nor can they fault).
    let (lo, hi) = unsafe {
        if n >= 32 {
            (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
        } else {
            let m0 = if n >= 16 { 0xffff } else { ((1u32 << n) - 1) as u16 };
            let m1 = if n > 16 { ((1u32 << (n - 16)) - 1) as u16 } else { 0 };
            (_mm512_maskz_loadu_ps(m0, p), _mm512_maskz_loadu_ps(m1, p.wrapping_add(16)))
        }
    };
    // cvtne2ps(a, b): low half from b, high half from a.
    // SAFETY: 32 bf16 as 16 words of 32 bits: the same 64 bytes, every pattern valid.
    unsafe { core::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo)) }
}

/// 16×16 transpose of u32: out[c] lane r = r_in[r] lane c. Three shuffle stages (pairs of
/// rows, then quads, then 128-bit lanes), 64 shuffles per 256 words.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
fn transpose16(r: &[__m512i; 16]) -> [__m512i; 16] {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        // (a0 b0 a1 b1 | a4 b4 a5 b5 | …), (a2 b2 a3 b3 | …)
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        // u[4i + j]: columns j, j+4, j+8, j+12 (one per 128-bit lane) of rows 4i..4i+3.
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    let mut o = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        let (u0, u1, u2, u3) = (u[j], u[4 + j], u[8 + j], u[12 + j]);
        let s0 = _mm512_shuffle_i32x4::<0x44>(u0, u1); // u0.L0 u0.L1 u1.L0 u1.L1
        let s1 = _mm512_shuffle_i32x4::<0xee>(u0, u1); // u0.L2 u0.L3 u1.L2 u1.L3
        let s2 = _mm512_shuffle_i32x4::<0x44>(u2, u3);
        let s3 = _mm512_shuffle_i32x4::<0xee>(u2, u3);
        o[j] = _mm512_shuffle_i32x4::<0x88>(s0, s2); // lane 0 of u0..u3
        o[j + 4] = _mm512_shuffle_i32x4::<0xdd>(s0, s2);
        o[j + 8] = _mm512_shuffle_i32x4::<0x88>(s1, s3);
        o[j + 12] = _mm512_shuffle_i32x4::<0xdd>(s1, s3);
    }
    o
}

/// See `super::pack_rows`, for w = NR = 32: per 16 k pairs, convert the panel's 32 rows
/// (32 zmm of 16 pairs), transpose the two 16×16 halves, store 16 × 32 contiguous words.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) fn pack_rows_nr(src: Mat<&[f32]>, kps: usize, dst: &mut [u32]) {
    let (lines, k1) = (src.rows(), src.cols());
    let panels = lines.div_ceil(NR);
    assert!(dst.len() >= panels * kps * NR, "pack_rows_nr: {} words for {panels} panels of {kps} pairs", dst.len());
    let (src, d) = (src.as_raw(), dst.as_mut_ptr());
    let zero = _mm512_setzero_si512();
    for p in 0..panels {
        let pd = d.wrapping_add(p * kps * NR);
        let mut kp = 0;
        while kp < kps {
            let kk = 2 * kp;
            let avail = k1.saturating_sub(kk).min(32);
            let cnt = (kps - kp).min(16);
            for h in 0..2 {
                let mut r = [zero; 16];
                for (i, ri) in r.iter_mut().enumerate() {
                    let l = p * NR + 16 * h + i;
                    if l < lines {
                        // SAFETY: row l of the view holds its k1 values, kk + avail ≤ k1 of them.
                        *ri = unsafe { cvt32(src.at(l, kk), avail) };
                    }
                }
                let o = transpose16(&r);
                for (t, ot) in o[..cnt].iter().enumerate() {
                    // SAFETY: kp + t < kps, so the 16 words at (p · kps + kp + t) · NR + 16h lie
                    // inside panel p of `dst` (asserted to hold every panel).
                    unsafe { _mm512_storeu_si512(pd.add((kp + t) * NR + 16 * h) as *mut _, *ot) };
                }
            }
            kp += 16;
        }
    }
}

/// Source rows prefetched ahead by `pack_cols_nr` (an even number).
const PF_ROWS: usize = 8;

/// See `super::convert_rows`: 32 k (16 pairs) per conversion, masked at the k end.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) fn convert_rows(src: Mat<&[f32]>, kps: usize, ld: usize, dst: &mut [u32]) {
    // SAFETY: u32 and MaybeUninit<u32> have one layout; the conversion only writes.
    convert_rows_uninit(src, kps, ld, unsafe { &mut *(dst as *mut [u32] as *mut [std::mem::MaybeUninit<u32>]) })
}

/// [`convert_rows`] into words not yet initialised: it writes kps words of every row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) fn convert_rows_uninit(src: Mat<&[f32]>, kps: usize, ld: usize, dst: &mut [std::mem::MaybeUninit<u32>]) {
    let (rows, k1) = (src.rows(), src.cols());
    assert!(ld >= kps && dst.len() >= rows.saturating_sub(1) * ld + kps, "convert_rows: {} words for {rows} rows of {kps} pairs, {ld} apart", dst.len());
    let (src, d) = (src.as_raw(), dst.as_mut_ptr() as *mut u32);
    for r in 0..rows {
        let dr = d.wrapping_add(r * ld);
        let mut kp = 0;
        while kp < kps {
            let kk = 2 * kp;
            // SAFETY: row r of the view holds its k1 values, kk + min(k1 - kk, 32) ≤ k1 of them.
            let v = unsafe { cvt32(src.at(r, kk), k1.saturating_sub(kk).min(32)) };
            let cnt = (kps - kp).min(16);
            // SAFETY: words kp..kp + cnt of row r's kps in `dst` (asserted to hold every row);
            // the mask keeps the store to them.
            unsafe {
                if cnt == 16 {
                    _mm512_storeu_si512(dr.add(kp) as *mut _, v);
                } else {
                    _mm512_mask_storeu_epi32(dr.add(kp) as *mut _, ((1u32 << cnt) - 1) as u16, v);
                }
            }
            kp += 16;
        }
    }
}

/// See `super::pack_cols`, for panel width NR = 32: per k pair, two rows × 16 columns are
/// converted together and interleaved (k, k+1) with one word permute.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) fn pack_cols_nr(src: Mat<&[f32]>, kps: usize, dst: &mut [u32]) {
    let (k1, lines) = (src.rows(), src.cols());
    let panels = lines.div_ceil(NR);
    assert!(dst.len() >= panels * kps * NR, "pack_cols_nr: {} words for {panels} panels of {kps} pairs", dst.len());
    // Word index: output word 2j ← row ka column j (word j), 2j+1 ← row kb column j (16 + j).
    let mut idx = [0u16; 32];
    for j in 0..16 {
        idx[2 * j] = j as u16;
        idx[2 * j + 1] = 16 + j as u16;
    }
    // SAFETY: `idx` is 64 readable bytes.
    let idx = unsafe { _mm512_loadu_si512(idx.as_ptr() as *const _) };
    let zero = _mm512_setzero_ps();
    let (src, d) = (src.as_raw(), dst.as_mut_ptr());
    // k pairs outer, columns inner: both source rows are read front to back (sources such
    // as a wide im2col have a row stride of tens of KiB; walking down a column strip
    // would touch a new page per load).
    for kp in 0..kps {
        let ka = 2 * kp;
        // Rows past k1 are never loaded from (their flag is off).
        let (sa, sb) = (src.row(ka), src.row(ka + 1));
        let (has_a, has_b) = (ka < k1, ka + 1 < k1);
        // Each source row contributes only a short segment (NC columns) per block, too short
        // for the hardware prefetcher to lock on: fetch the rows PF_ROWS ahead ourselves (a
        // prefetch never faults).
        if ka + PF_ROWS + 1 < k1 {
            let (pa, pb) = (src.row(ka + PF_ROWS), src.row(ka + 1 + PF_ROWS));
            for off in (0..lines).step_by(16) {
                _mm_prefetch::<_MM_HINT_T0>(pa.wrapping_add(off) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(pb.wrapping_add(off) as *const i8);
            }
        }
        for p in 0..panels {
            let pd = d.wrapping_add(p * kps * NR + kp * NR);
            for h in 0..2 {
                let cc = p * NR + 16 * h;
                let nvalid = lines.saturating_sub(cc).min(16);
                let mask: __mmask16 = if nvalid >= 16 { 0xffff } else { ((1u32 << nvalid) - 1) as u16 };
                // SAFETY: rows ka and kb, where they are in the view, hold its `lines` columns,
                // and the mask keeps the loads to those from cc on (masked-off lanes are not
                // read, nor can they fault); the 16 words stored at (p · kps + kp) · NR + 16h
                // lie inside panel p of `dst` (asserted to hold every panel); the transmute
                // changes only the type of 64 bytes, every pattern of which is valid.
                unsafe {
                    let ra = if has_a { _mm512_maskz_loadu_ps(mask, sa.wrapping_add(cc)) } else { zero };
                    let rb = if has_b { _mm512_maskz_loadu_ps(mask, sb.wrapping_add(cc)) } else { zero };
                    let v: __m512i = core::mem::transmute(_mm512_cvtne2ps_pbh(rb, ra));
                    _mm512_storeu_si512(pd.add(16 * h) as *mut _, _mm512_permutexvar_epi16(idx, v));
                }
            }
        }
    }
}

/// A group of C leaving the tiles' edge buffer (rows of NR floats): C's mv × nv block at `out`
/// = the buffer's [+ bias per column [then GELU]] [then x + gamma · that, `residual` = (gamma
/// per column, x's block, its row stride)], in one pass with masked stores, instead of a pass
/// per step and a `memcpy` per row.
///
/// # Safety
/// The CPU has AVX-512F, and AVX512-BF16 (with BW and VL) for a bf16 `out`; `edge` holds mv
/// rows of NR floats (mv ≤ 32, nv ≤ NR), `bias` (if any) nv floats, the residual's mv rows of
/// nv floats are readable, and `out`'s mv rows of nv values are writable.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn edge_out(
    edge: &[f32],
    mv: usize,
    nv: usize,
    bias: Option<&[f32]>,
    gelu: bool,
    residual: Option<(&[f32], *const f32, usize)>,
    out: super::Out,
) {
    assert!(edge.len() >= mv * NR && nv <= NR && bias.is_none_or(|b| b.len() >= nv) && residual.is_none_or(|r| r.0.len() >= nv), "edge_out: shapes");
    let (m0, m1) = crate::simd::avx512::masks(nv);
    let (b0, b1) = match bias {
        // SAFETY: the masks cover the first nv of bias's floats (asserted).
        Some(b) => unsafe { (_mm512_maskz_loadu_ps(m0, b.as_ptr()), _mm512_maskz_loadu_ps(m1, b.as_ptr().wrapping_add(16))) },
        None => (_mm512_setzero_ps(), _mm512_setzero_ps()),
    };
    for r in 0..mv {
        // SAFETY: row r of `edge` is NR floats (asserted); the masked stores reach only the
        // first nv floats of C's row r (the caller's promise); masked-off lanes never fault.
        unsafe {
            let e = edge.as_ptr().add(r * NR);
            let (mut v0, mut v1) = (_mm512_add_ps(_mm512_loadu_ps(e), b0), _mm512_add_ps(_mm512_loadu_ps(e.add(16)), b1));
            if gelu {
                v0 = gelu16(v0);
                v1 = gelu16(v1);
            }
            if let Some((g, x, ldx)) = residual {
                // x + gamma · v; the masks keep the loads to row r's first nv floats.
                let (g0, g1) = (_mm512_maskz_loadu_ps(m0, g.as_ptr()), _mm512_maskz_loadu_ps(m1, g.as_ptr().wrapping_add(16)));
                let xr = x.add(r * ldx);
                v0 = _mm512_fmadd_ps(v0, g0, _mm512_maskz_loadu_ps(m0, xr));
                v1 = _mm512_fmadd_ps(v1, g1, _mm512_maskz_loadu_ps(m1, xr.wrapping_add(16)));
            }
            match out {
                super::Out::F32(c, ldc) => {
                    let cr = c.add(r * ldc);
                    _mm512_mask_storeu_ps(cr, m0, v0);
                    _mm512_mask_storeu_ps(cr.wrapping_add(16), m1, v1);
                }
                super::Out::Bf16(c, ldc) => {
                    // Rounded as `convert_rows` would round them for the next product.
                    let cr = c.add(r * ldc) as *mut i16;
                    let (h0, h1) =
                        (core::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v0)), core::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v1)));
                    _mm256_mask_storeu_epi16(cr, m0, h0);
                    _mm256_mask_storeu_epi16(cr.wrapping_add(16), m1, h1);
                }
            }
        }
    }
}

/// See `super::exp_pairs`: e^(scale · (x − max)) of each of `row`'s values, written as bf16
/// pairs into `dst` (zero past them), the sum of the f32 exps returned, by [`pow2`] with [`POW2_SHORT`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) fn exp_pairs(row: &[f32], scale: f32, dst: &mut [u32]) -> f32 {
    let k = row.len();
    assert!(dst.len() >= k.div_ceil(2), "exp_pairs: {} words for {k} values", dst.len());
    let p = row.as_ptr();
    let tail = |n: usize| -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            ((1u32 << n) - 1) as u16
        }
    };
    let (mut m0, mut m1) = (_mm512_set1_ps(f32::NEG_INFINITY), _mm512_set1_ps(f32::NEG_INFINITY));
    let mut i = 0;
    while i + 32 <= k {
        // SAFETY: values i..i + 32 of `row`.
        unsafe {
            m0 = _mm512_max_ps(m0, _mm512_loadu_ps(p.add(i)));
            m1 = _mm512_max_ps(m1, _mm512_loadu_ps(p.add(i + 16)));
        }
        i += 32;
    }
    while i < k {
        // SAFETY: the lanes of the mask are values i.. of `row` (at most its k − i left).
        m0 = _mm512_max_ps(m0, unsafe { _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), tail(k - i), p.add(i)) });
        i += 16;
    }
    let max = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
    let s = scale * std::f32::consts::LOG2_E;
    let (vs, vb) = (_mm512_set1_ps(s), _mm512_set1_ps(-max * s));
    let exp16 = |x: __m512| -> __m512 { pow2(_mm512_fmadd_ps(x, vs, vb), &POW2_SHORT) };
    let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let d = dst.as_mut_ptr();
    let mut kk = 0;
    // Whole 32-value steps without masks, then the tail's.
    while kk + 32 <= k {
        // SAFETY: values kk..kk + 32 of `row`; words kk/2..kk/2 + 16 of `dst` (k.div_ceil(2)
        // asserted).
        unsafe {
            let (lo, hi) = (exp16(_mm512_loadu_ps(p.add(kk))), exp16(_mm512_loadu_ps(p.add(kk + 16))));
            s0 = _mm512_add_ps(s0, lo);
            s1 = _mm512_add_ps(s1, hi);
            // cvtne2ps(a, b): low half from b, high half from a: word j = (x[2j], x[2j + 1]).
            let w: __m512i = core::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(d.add(kk / 2) as *mut _, w);
        }
        kk += 32;
    }
    if kk < k {
        let (m0, m1) = (tail(k - kk), tail(k.saturating_sub(kk + 16)));
        // SAFETY: the masks' lanes are values of `row` (kk.. and kk + 16..); masked-off lanes
        // are not read, and their exps are zeroed; words kk/2.. of `dst`, up to k.div_ceil(2).
        unsafe {
            let lo = _mm512_maskz_mov_ps(m0, exp16(_mm512_maskz_loadu_ps(m0, p.add(kk))));
            let hi = _mm512_maskz_mov_ps(m1, exp16(_mm512_maskz_loadu_ps(m1, p.wrapping_add(kk + 16))));
            s0 = _mm512_add_ps(s0, lo);
            s1 = _mm512_add_ps(s1, hi);
            let w: __m512i = core::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_mask_storeu_epi32(d.add(kk / 2) as *mut _, tail((k - kk).div_ceil(2)), w);
        }
    }
    // Words past the values up to the row's end: zero pairs (the tiles read whole 16-pair rows).
    dst[k.div_ceil(2)..].fill(0);
    _mm512_reduce_add_ps(_mm512_add_ps(s0, s1))
}
