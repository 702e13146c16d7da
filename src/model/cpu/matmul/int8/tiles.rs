//! The tile route of the int8 products (Intel AMX's `tdpbusd`), on any [`TileUnit`]: the
//! hardware's where the CPU has AMX-INT8, the emulation's in every machine's tests.
//!
//! The AVX512-VNNI route's layouts are already what a tile reads: a weight panel's quad is its
//! 32 channels' words side by side (a B tile is 16 quads × 16 channels at the panel's 128-byte
//! stride), a row of activations its u8 quads (an A tile is 16 rows × 64 bytes). Only the
//! padding differs: quads to a multiple of 16 (zero weights), rows of A to 64 bytes, A readable
//! for 32 rows past any row, and both on cache lines (`super::Store::Panels`, `super::QuantA`).
//!
//! Per group of 32 × 32 outputs: four i32 accumulator tiles over all of K, stored to a buffer,
//! then the VNNI route's epilogue, `y = (acc − z · Σq) · (s_a · s_w) + bias`, the same
//! operations in the same order (so the same bits).

use super::Tile;
use crate::simd::tiles::{TileUnit, ROWS};

/// Output channels per panel (two tiles of 16).
pub(super) const NR: usize = 32;
/// Rows per group (two tiles of 16).
pub(super) const MR: usize = 2 * ROWS;

/// The most k steps (of 64) a group may have for its rows of C to be prefetched ([`run`]).
/// Products of ViT-L's shapes, 1800 rows, 2 threads, an Intel Xeon with AMX, in turns: at K =
/// 1024 (16 steps) 1800x3072 3.20-3.23 -> 2.56-2.60 ms, 1800x1024 1.03 -> 0.86; at K = 4096 (64
/// steps), where the epilogue's stores hide in the longer group, 2.62-2.63 -> 2.75 ms.
const PREFETCH_MAX_STEPS: usize = 32;

/// The accumulators of a group, on a cache line.
#[repr(C, align(64))]
struct Acc([i32; MR * NR]);

/// The groups `tiles` in turn, pipelined: a group's epilogue (vector code, and its stores to
/// C) runs a few rows per k step inside the next group's tile loop, so that it runs beside the
/// tile products instead of after them (as the bf16 tiles do: `bf16::tiles::block`). Two
/// accumulator buffers take turns.
///
/// # Safety
/// As [`group`], for every tile.
pub(super) unsafe fn run<'a, U: TileUnit>(u: &mut U, tiles: impl Iterator<Item = Tile<'a>>, fast: bool) {
    let mut accs = [Acc([0; MR * NR]), Acc([0; MR * NR])];
    // Raw pointers: the tiles write one buffer while the other's epilogue reads it.
    let ptrs = [accs[0].0.as_mut_ptr(), accs[1].0.as_mut_ptr()];
    let mut pending: Option<(Tile<'a>, usize)> = None;
    let mut turn = 0;
    let finish = |t: &Tile, which: usize, rows: std::ops::Range<usize>| {
        // SAFETY: accumulator buffer `which` holds the pending group's stored tiles, and the
        // tiles write the other one meanwhile; the caller's promise for `t`.
        let acc = unsafe { &*(ptrs[which] as *const Acc) };
        if fast {
            // SAFETY: the caller's promise (AVX-512F and FMA: every CPU with AMX has them).
            #[cfg(target_arch = "x86_64")]
            unsafe {
                epilogue_avx512(t, acc, rows)
            };
        } else {
            epilogue(t, acc, rows);
        }
    };
    for t in tiles {
        let mut done = 0;
        let (mv, nv) = (t.c.rows(), t.c.cols());
        let c = t.c;
        let mut hook = |step: usize, steps: usize| {
            // At short K, this group's rows of C, asked for in the writable state a few at a
            // time, so that its epilogue (during the next group) does not wait on them: at K =
            // 1024 the epilogue's stores otherwise cost as much as the tiles' work.
            if steps <= PREFETCH_MAX_STEPS {
                c.prefetch_for_write(mv * step / steps..mv * (step + 1) / steps, 0, nv);
            }
            if let Some((p, which)) = &pending {
                let upto = p.c.rows() * (step + 1) / steps;
                finish(p, *which, done..upto);
                done = upto;
            }
        };
        // SAFETY: the caller's promise; `ptrs[turn]` is a whole accumulator buffer that no
        // pending epilogue reads.
        unsafe { group(u, &t, ptrs[turn], &mut hook) };
        if let Some((p, which)) = pending.take() {
            finish(&p, which, done..p.c.rows());
        }
        pending = Some((t, turn));
        turn ^= 1;
    }
    if let Some((p, which)) = pending {
        finish(&p, which, 0..p.c.rows());
    }
}

/// One group's products: `t.c`'s (≤ 32 rows × ≤ 32 columns) accumulators from its quantised
/// rows and one panel, stored to `out` (an [`Acc`]); `hook(step, steps)` after each k step.
///
/// # Safety
/// `t.holds(NR)`, `t.kq` is a multiple of 16, `t.lda` of 64, A and the panel start on cache
/// lines, and A is readable for 32 rows of `t.lda` bytes from `t.a`; `out` is a whole [`Acc`].
#[inline(always)]
unsafe fn group<U: TileUnit>(u: &mut U, t: &Tile, out: *mut i32, hook: &mut impl FnMut(usize, usize)) {
    let mv = t.c.rows();
    debug_assert!(t.holds(NR) && mv <= MR && t.kq.is_multiple_of(ROWS));
    let out = out as *mut u8;
    let (a0, a1, lda) = (t.a.as_ptr(), t.a.as_ptr().wrapping_add(ROWS * t.lda), t.lda);
    let two_rows = mv > ROWS;
    u.zero::<0>();
    u.zero::<1>();
    u.zero::<2>();
    u.zero::<3>();
    let steps = t.kq / ROWS;
    for (step, kk) in (0..t.kq).step_by(ROWS).enumerate() {
        let b = t.b.as_ptr().wrapping_add(kk * NR) as *const u8;
        // SAFETY: the caller's promise: 16 quads of the panel (16 rows of 128 bytes, two tiles
        // side by side) and 16 (32) rows of A's 16 quads at `lda`.
        unsafe {
            u.load::<6>(b, NR * 4);
            u.load::<7>(b.wrapping_add(64), NR * 4);
            u.load::<4>(a0.wrapping_add(4 * kk), lda);
            u.dp_u8s8::<0, 4, 6>();
            u.dp_u8s8::<1, 4, 7>();
            if two_rows {
                u.load::<5>(a1.wrapping_add(4 * kk), lda);
                u.dp_u8s8::<2, 5, 6>();
                u.dp_u8s8::<3, 5, 7>();
            }
        }
        // Vector work beside the tiles' (the previous group's epilogue).
        hook(step, steps);
    }
    // SAFETY: `out` is 32 rows of 128 bytes: each tile is 16 of them, 64 bytes wide.
    unsafe {
        u.store::<0>(out, NR * 4);
        u.store::<1>(out.wrapping_add(64), NR * 4);
        u.store::<2>(out.wrapping_add(ROWS * NR * 4), NR * 4);
        u.store::<3>(out.wrapping_add(ROWS * NR * 4 + 64), NR * 4);
    }
}

/// [`epilogue`] in AVX-512 vectors: the same operations in the same order (a wrapping i32
/// product and difference, then one fused multiply-add), so the same bits before the GELU;
/// the GELU is the bf16 tiles' vector one (`simd::avx512::gelu16`, within 2e-6 of
/// `simd::math::gelu`). Each row stored by two masked stores (a `memcpy` call per row of 32
/// floats cost as much as a sixth of the product at ViT-L's fc1). The GELU's operations are
/// felt here, where a group's tile work is half bf16's: with the erfc form's, fc1 took 5.7-5.8
/// ms against 4.7-4.8 with the table's (an Intel Xeon with AMX, `examples/encoder_bench.rs`).
///
/// # Safety
/// The CPU has AVX-512F and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn epilogue_avx512(t: &Tile, acc: &Acc, rows: std::ops::Range<usize>) {
    use core::arch::x86_64::*;
    let (m0, m1) = crate::simd::avx512::masks(t.c.cols());
    let (cs, sw, bias): (&[i32; NR], &[f32; NR], &[f32; NR]) = (fixed(t.colsum), fixed(t.scale_b), fixed(t.bias));
    // SAFETY: NR = 32 values in each of the panel's arrays.
    let (cs0, cs1, sw0, sw1, b0, b1) = unsafe {
        (
            _mm512_loadu_si512(cs.as_ptr() as *const _),
            _mm512_loadu_si512(cs.as_ptr().add(16) as *const _),
            _mm512_loadu_ps(sw.as_ptr()),
            _mm512_loadu_ps(sw.as_ptr().add(16)),
            _mm512_loadu_ps(bias.as_ptr()),
            _mm512_loadu_ps(bias.as_ptr().add(16)),
        )
    };
    for r in rows {
        let (z, s) = (_mm512_set1_epi32(t.zero_a[r]), _mm512_set1_ps(t.scale_a[r]));
        // SAFETY: row r of the accumulators is NR i32; row r's first nv columns are in C and
        // this tile's (`Tile::c`): the masks keep the stores to them.
        unsafe {
            let a = acc.0.as_ptr().add(r * NR);
            let v0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(a as *const _), _mm512_mullo_epi32(z, cs0)));
            let v1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(a.add(16) as *const _), _mm512_mullo_epi32(z, cs1)));
            let mut y0 = _mm512_fmadd_ps(v0, _mm512_mul_ps(s, sw0), b0);
            let mut y1 = _mm512_fmadd_ps(v1, _mm512_mul_ps(s, sw1), b1);
            if t.gelu {
                y0 = crate::simd::avx512::gelu16(y0);
                y1 = crate::simd::avx512::gelu16(y1);
            }
            _mm512_mask_storeu_ps(t.c.row(r), m0, y0);
            _mm512_mask_storeu_ps(t.c.row(r).wrapping_add(16), m1, y1);
        }
    }
}

/// C's tile from the group's accumulators: the VNNI route's epilogue, element by element.
#[inline(always)]
fn epilogue(t: &Tile, acc: &Acc, rows: std::ops::Range<usize>) {
    let nv = t.c.cols();
    // SAFETY: row r's first nv columns are in C and this tile's (`Tile::c`).
    epilogue_rows(t, acc, rows, |r, y| unsafe { std::ptr::copy_nonoverlapping(y.as_ptr(), t.c.row(r), nv) })
}

/// The epilogue's rows, each handed to `store` as NR floats (its first nv are C's).
#[inline(always)]
fn epilogue_rows(t: &Tile, acc: &Acc, rows: std::ops::Range<usize>, mut store: impl FnMut(usize, &[f32; NR])) {
    // The panel's NR columns as fixed-size arrays, so that the loop below is whole vectors
    // with no bounds checks (the sliced loop cost as much as the tiles' products).
    let (cs, sw, bias): (&[i32; NR], &[f32; NR], &[f32; NR]) = (fixed(t.colsum), fixed(t.scale_b), fixed(t.bias));
    let mut y = [0f32; NR];
    for r in rows {
        let (z, s) = (t.zero_a[r], t.scale_a[r]);
        let row: &[i32; NR] = fixed(&acc.0[r * NR..]);
        for j in 0..NR {
            // A wrapping i32 product and difference, then one fused multiply-add (exactly
            // rounded wherever it runs): `vpmulld`, `vpsubd`, `vfmadd` there.
            let v = row[j].wrapping_sub(z.wrapping_mul(cs[j])) as f32;
            y[j] = v.mul_add(s * sw[j], bias[j]);
        }
        if t.gelu {
            y.iter_mut().for_each(|v| *v = crate::simd::math::gelu(*v));
        }
        store(r, &y);
    }
}

/// The first NR values of `v` (which holds them: `Tile::holds`).
#[inline(always)]
fn fixed<T>(v: &[T]) -> &[T; NR] {
    v[..NR].try_into().expect("NR values")
}
