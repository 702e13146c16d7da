//! The tile route of the bf16 GEMM (Intel AMX's `tdpbf16ps`), on any [`TileUnit`]: the
//! hardware's where the CPU has it, the emulation's in every machine's tests.
//!
//! The operands keep the layouts of the AVX512-BF16 route (`super`), which are already what a
//! tile reads: a row of A is its k pairs (an A tile is 16 rows × 16 pairs, one `tileloadd` at
//! the rows' stride), and a B panel's k pair is its 32 columns' words side by side (a B tile is
//! 16 pairs × 16 columns, one `tileloadd` at the panel's 128-byte stride). Only the padding
//! differs: k pairs to a multiple of 16 (zeros), A readable for its rows rounded up to 16, and
//! every operand on a cache line (a tile load across lines runs 6x slower).
//!
//! Register blocking: C in 32 × 32 groups, four accumulator tiles (0..4), two A tiles (4, 5)
//! and two B tiles (6, 7): per 16 k pairs, four loads feed four products.

use super::{f32_to_bf16, Epilogue, Out, NR};
use crate::simd::tiles::{TileUnit, ROWS};
use crate::simd::{MatMut, MatRef};

/// Rows of C per group: two tiles of 16.
pub(super) const TM: usize = 2 * ROWS;
/// K block, in elements. The tiles stream A and B from L2 at 2.0 TFLOP/s a core, from L1 at 2.8
/// and from L3 at 0.46 (`examples/amx_peak.rs`, an Intel Xeon with AMX, 2026-12-03): the
/// operands must come from L2. A thread converts A's block for all its rows at once (fc2: 900
/// rows × K = 4096 is 7 MiB, past L2) and reads it again from L3 for each column block of B
/// (1 MiB of B: 128 columns at K = 4096, 256 at 2048). Two k blocks of 2048 halve those
/// passes for the cost of one more over C: ViT-L's fc2 (1800 × 4096 × 1024) 6.8-6.9 ms -> 5.9,
/// the other linears (K ≤ 1024) unchanged (`examples/encoder_bench.rs`, the same Xeon,
/// 2026-12-07). At K = 1024 fc2 took 6.1 ms.
pub(super) const KC: usize = 2048;
/// Bytes of B per column block (KC/2 pairs × NC columns × 4), in the 2 MiB L2 beside a row
/// group's A (≤ 32 × KC/2 × 4 = 256 KiB).
pub(super) const B_BLOCK_BYTES: usize = 1024 * 1024;

/// A 32 × 32 f32 group of C for the edges, on a cache line (tile rows are 64 bytes).
#[repr(C, align(64))]
struct Edge([f32; TM * NR]);

/// A group whose tiles were stored to an edge buffer and whose epilogue (the copy to C, with
/// the bias and GELU) is still to run: `mv` × `nv` of C at (`i`, `j`), from edge `edge`.
#[derive(Clone, Copy)]
struct Pending {
    edge: usize,
    i: usize,
    j: usize,
    mv: usize,
    nv: usize,
}

/// All groups of C (`c`) for one k block: A (`a`) its rows' k pairs, B (`b`) one row per NR
/// columns of C, its panel's k pairs (NR words each); A, B and C on cache lines where they can
/// be (C's misaligned groups go through a copy). `epilogue`: the bias (one per column of `c`)
/// and GELU added as the groups leave the tiles (the last k block's), and the rows stored to
/// its bf16 matrix where it has one (C is then neither read nor written).
///
/// The groups that go through an edge buffer are pipelined: a group's epilogue (vector code)
/// runs a few rows per k step inside the next group's tile loop, so that the vector units work
/// while the tiles multiply (fc1's exact GELU on its own took a quarter of the product's time,
/// an Intel Xeon with AMX, 2026-12-04). Two edge buffers take turns.
///
/// # Safety
/// `a.cols()` is a multiple of 16; A is readable for `c.rows()` rounded up to 16 rows of
/// `a.cols()` words; each row of `b` holds `a.cols()` · NR readable words; every element of `c`
/// is readable and writable.
pub(super) unsafe fn block<U: TileUnit>(u: &mut U, a: MatRef<u32>, b: MatRef<u32>, c: MatMut<f32>, load_c: bool, epilogue: Option<Epilogue>) {
    let (rows, cols) = (c.rows(), c.cols());
    debug_assert!(a.cols().is_multiple_of(ROWS));
    let mut edges = [Edge([0.0; TM * NR]), Edge([0.0; TM * NR])];
    // Raw pointers: the tiles write one buffer while the other is read by the epilogue.
    let edge_ptrs = [edges[0].0.as_mut_ptr(), edges[1].0.as_mut_ptr()];
    let mut pending: Option<Pending> = None;
    let mut turn = 0;
    // Rows `r` of a pending group's epilogue: C's rows = the edge's [+ bias [then GELU]].
    let finish = |p: Pending, r: std::ops::Range<usize>| {
        if r.is_empty() {
            return;
        }
        // SAFETY: edge `p.edge` is a whole group that the tiles no longer write (they write the
        // other one meanwhile); rows `r` ≤ p.mv of C's group at (p.i, p.j) are the caller's.
        unsafe {
            let edge = std::slice::from_raw_parts(edge_ptrs[p.edge] as *const f32, TM * NR);
            // Where the rows go: C, or the epilogue's bf16 matrix in its place.
            let bf16 = epilogue.and_then(|e| e.bf16);
            let out = |row: usize| match bf16 {
                Some(o) => Out::Bf16(o.at(row, p.j), o.stride()),
                None => Out::F32(c.at(row, p.j), c.stride()),
            };
            #[cfg(target_arch = "x86_64")]
            if U::AVX512 {
                // SAFETY: `U::AVX512`: the hardware's unit, which exists only on the `amx`
                // level, which has AVX-512F, BW, VL and BF16 (`isa::detect`).
                super::avx512bf16::edge_out(
                    &edge[r.start * NR..],
                    r.len(),
                    p.nv,
                    epilogue.map(|e| &e.bias[p.j..p.j + p.nv]),
                    epilogue.is_some_and(|e| e.gelu.is_some()),
                    epilogue.and_then(|e| e.residual).map(|(g, res)| (&g[p.j..p.j + p.nv], res.at(p.i + r.start, p.j), res.stride())),
                    out(p.i + r.start),
                );
                return;
            }
            let (first, mut row) = (out(p.i + r.start), [0f32; NR]);
            for rr in r.clone() {
                row.copy_from_slice(&edge[rr * NR..(rr + 1) * NR]);
                if let Some(e) = &epilogue {
                    row[..p.nv].iter_mut().zip(&e.bias[p.j..p.j + p.nv]).for_each(|(v, b)| *v += b);
                    if let Some(level) = e.gelu {
                        crate::simd::math::gelu_in_place(level, &mut row);
                    }
                    if let Some((g, res)) = e.residual {
                        let x = std::slice::from_raw_parts(res.at(p.i + rr, p.j), p.nv);
                        row[..p.nv].iter_mut().zip(x).zip(&g[p.j..p.j + p.nv]).for_each(|((v, &x), &g)| *v = x + *v * g);
                    }
                }
                match first {
                    Out::F32(dst, ld) => std::ptr::copy_nonoverlapping(row.as_ptr(), dst.add((rr - r.start) * ld), p.nv),
                    Out::Bf16(dst, ld) => row[..p.nv].iter().enumerate().for_each(|(q, &v)| *dst.add((rr - r.start) * ld + q) = f32_to_bf16(v)),
                }
            }
        }
    };
    // Row groups outer: a group's A is read by every panel of the block while it is in L1/L2.
    for i in (0..rows).step_by(TM) {
        let mv = (rows - i).min(TM);
        for (jp, j) in (0..cols).step_by(NR).enumerate() {
            let nv = (cols - j).min(NR);
            // C's own rows only where they start on cache lines: a tile load that straddles
            // lines runs 6x slower (`examples/amx_peak.rs`), so others go through an edge.
            // With an epilogue every group goes through one, where it is applied in L1.
            let full = mv == TM && nv == NR && (c.at(i, j) as usize).is_multiple_of(64) && (c.stride() * 4).is_multiple_of(64) && epilogue.is_none();
            let at = MatRef::from_ptr(a.row(i), mv, a.cols(), a.stride());
            // The pending group's rows, spread over this group's k steps.
            let mut done = 0;
            let mut hook = |step: usize, steps: usize| {
                if let Some(p) = pending {
                    let upto = p.mv * (step + 1) / steps;
                    finish(p, done..upto);
                    done = upto;
                }
            };
            // SAFETY: the caller's promise, for rows i..i + mv of A and C (A readable to the
            // next 16), panel jp of B and its nv columns of C; an edge is a whole 32 × 32 group.
            unsafe {
                if full {
                    group::<U, true, true>(u, at, b.row(jp), c.at(i, j), c.stride(), load_c, &mut hook);
                } else {
                    // The edge: C's part copied into the group and copied back by its epilogue.
                    // What lies past it in the edge is left as it is: each element of C depends
                    // on itself alone, and those are not copied back.
                    let e = edge_ptrs[turn];
                    if load_c {
                        for r in 0..mv {
                            std::ptr::copy_nonoverlapping(c.at(i + r, j) as *const f32, e.add(r * NR), nv);
                        }
                    }
                    match (mv > ROWS, nv > ROWS) {
                        (true, true) => group::<U, true, true>(u, at, b.row(jp), e, NR, load_c, &mut hook),
                        (true, false) => group::<U, true, false>(u, at, b.row(jp), e, NR, load_c, &mut hook),
                        (false, true) => group::<U, false, true>(u, at, b.row(jp), e, NR, load_c, &mut hook),
                        (false, false) => group::<U, false, false>(u, at, b.row(jp), e, NR, load_c, &mut hook),
                    }
                }
            }
            if let Some(p) = pending.take() {
                finish(p, done..p.mv);
            }
            if !full {
                pending = Some(Pending { edge: turn, i, j, mv, nv });
                turn ^= 1;
            }
        }
    }
    if let Some(p) = pending {
        finish(p, 0..p.mv);
    }
}

/// One 32 × 32 group at `c` (rows `ldc` floats apart) over all of A's k pairs: the second row
/// tile only where `R2` and the second column tile only where `C2` (the edges').
///
/// # Safety
/// As [`block`], for A's rows from `a.ptr()` (16 of them, 32 with `R2`), one B panel at `b`,
/// and 32 × 32 floats of C at `c`. `hook(step, steps)` runs after each of the k loop's steps.
#[inline(always)]
unsafe fn group<U: TileUnit, const R2: bool, const C2: bool>(
    u: &mut U,
    a: MatRef<u32>,
    b: *const u32,
    c: *mut f32,
    ldc: usize,
    load_c: bool,
    hook: &mut impl FnMut(usize, usize),
) {
    let (lda, ldc) = (a.stride() * 4, ldc * 4);
    let c = c as *mut u8;
    let (c01, c10, c11) = (c.wrapping_add(64), c.wrapping_add(ROWS * ldc), c.wrapping_add(ROWS * ldc + 64));
    // SAFETY: the caller's promise: 16 rows of 64 bytes at each address, at these strides.
    unsafe {
        if load_c {
            u.load::<0>(c, ldc);
            u.load::<1>(c01, ldc);
            u.load::<2>(c10, ldc);
            u.load::<3>(c11, ldc);
        } else {
            u.zero::<0>();
            u.zero::<1>();
            u.zero::<2>();
            u.zero::<3>();
        }
        let (a0, a1) = (a.ptr() as *const u8, a.row(ROWS) as *const u8);
        let steps = a.cols() / ROWS;
        for (step, kk) in (0..a.cols()).step_by(ROWS).enumerate() {
            let bk = b.wrapping_add(kk * NR) as *const u8;
            u.load::<6>(bk, NR * 4);
            if C2 {
                u.load::<7>(bk.wrapping_add(64), NR * 4);
            }
            u.load::<4>(a0.wrapping_add(kk * 4), lda);
            u.dp_bf16::<0, 4, 6>();
            if C2 {
                u.dp_bf16::<1, 4, 7>();
            }
            if R2 {
                u.load::<5>(a1.wrapping_add(kk * 4), lda);
                u.dp_bf16::<2, 5, 6>();
                if C2 {
                    u.dp_bf16::<3, 5, 7>();
                }
            }
            // Vector work beside the tiles' (the previous group's epilogue).
            hook(step, steps);
        }
        u.store::<0>(c, ldc);
        u.store::<1>(c01, ldc);
        u.store::<2>(c10, ldc);
        u.store::<3>(c11, ldc);
    }
}
