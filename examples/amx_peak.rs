//! The AMX bf16 tile rate of this machine's cores, the yardstick of the tile GEMM's figures in
//! PERFORMANCE.md: `tdpbf16ps` on four independent accumulator tiles (16 × 16 × 32 multiply-adds
//! each), first with its operands resident in tiles, then reloading A and B every step (the
//! GEMM's 2 × 2 loop) from buffers of growing size: L1, L2, L3.
//!
//! `cargo run --release --example amx_peak`

#[cfg(target_arch = "x86_64")]
fn main() {
    use moge::simd::amx::{support, Amx};
    use moge::simd::tiles::TileUnit;
    use std::time::Instant;
    let Some(mut u) = Amx::new() else {
        println!("no usable AMX here: {:?}", support());
        return;
    };
    const FLOP_PER_DP: f64 = 2.0 * 16.0 * 16.0 * 32.0;
    let steps = 2_000_000usize;
    for round in 0..3 {
        let buf = vec![0x3f80_3f80u32; 1024];
        let t = Instant::now();
        // SAFETY: `buf` holds 4 KiB: each load reads 16 rows of 64 bytes at stride 64.
        unsafe {
            u.load::<4>(buf.as_ptr() as *const u8, 64);
            u.load::<5>(buf.as_ptr() as *const u8, 64);
            u.load::<6>(buf.as_ptr() as *const u8, 64);
            u.load::<7>(buf.as_ptr() as *const u8, 64);
        }
        for _ in 0..steps {
            u.dp_bf16::<0, 4, 6>();
            u.dp_bf16::<1, 4, 7>();
            u.dp_bf16::<2, 5, 6>();
            u.dp_bf16::<3, 5, 7>();
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "round {round}: resident operands  {:7.1} GFLOP/s  ({:.1} ns per tdpbf16ps)",
            4.0 * steps as f64 * FLOP_PER_DP / s / 1e9,
            s * 1e9 / (4 * steps) as f64
        );
        for kib in [16usize, 64, 256, 1024, 16384] {
            // A and B halves of `kib` KiB, streamed as the GEMM's 2 × 2 loop streams them.
            let words = kib * 256;
            // On a cache line, as the GEMM's operands are: a tile load across lines is slow.
            let store = vec![0x3f80_3f80u32; words + 16];
            let buf = &store[(store.as_ptr() as usize).wrapping_neg() % 64 / 4..][..words];
            let half = words / 2;
            let n = (steps / 4).max(1);
            let t = Instant::now();
            let mut off = 0usize;
            for _ in 0..n {
                let a = buf[off..].as_ptr() as *const u8;
                let b = buf[half + off..].as_ptr() as *const u8;
                // SAFETY: off + 2048 words stays inside each half (`off` wraps before it).
                unsafe {
                    u.load::<6>(b, 128);
                    u.load::<7>(b.add(64), 128);
                    u.load::<4>(a, 128);
                    u.dp_bf16::<0, 4, 6>();
                    u.dp_bf16::<1, 4, 7>();
                    u.load::<5>(a.add(64), 128);
                    u.dp_bf16::<2, 5, 6>();
                    u.dp_bf16::<3, 5, 7>();
                }
                off += 512;
                if off + 512 > half {
                    off = 0;
                }
            }
            let s = t.elapsed().as_secs_f64();
            println!("round {round}: operands from {kib:>5} KiB {:7.1} GFLOP/s", 4.0 * n as f64 * FLOP_PER_DP / s / 1e9);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("AMX is an x86-64 extension");
}
