//! GFLOP/s of the bf16 GEMM (`moge::model::cpu::matmul::bf16`) next to the `gemm` crate's f32 GEMM on
//! the same shapes, measured interleaved (the machine is shared: compare the ratio).
//!
//! `cargo run --release --example bf16_bench [reps] [shape filter, e.g. 1800×1024]`
//!
//! ViT shapes (tokens × weightsᵀ) go through `gemm_bf16` (A = f32 tokens, converted per call;
//! B = `PackedB`, packed once and timed separately); conv shapes (weights × im2col) through
//! `gemm_bf16_packed_a` (A = `PackedA`, once; B = f32 columns, converted per call).
//!
//! Measured 2026-11-30 on the 2-vCPU dev VM (AMD EPYC family 26, i.e. Zen 5), in a quiet
//! moment: ViT shapes 870–930 GFLOP/s on 2 threads, 440–480 on 1 (gemm f32: 235–245 / 115–125);
//! conv 256×2304×2048 ≈ 780 / 410 (f32 ≈ 230 / 118). 32×576×16384 is bound by reading its 38 MB
//! f32 im2col (≈ 255 / 135). The run-to-run spread on the shared VM is large: look at ratios.

mod common;
use common::median;
use common::rng::Rng;
use moge::model::cpu::matmul::bf16::{self, PackedA, PackedB};
use moge::model::cpu::matmul::gemm::{Gemm, Strided};
use moge::simd::Mat;
use std::time::Instant;

/// `gemm` crate f32: C = A · B, B read with strides (column `b_cs`, row `b_rs`), as candle does
/// for a Linear's transposed weight.
// The shapes and strides as `gemm` takes them, one by one.
#[allow(clippy::too_many_arguments)]
fn f32_gemm(a: &[f32], b: &[f32], b_cs: usize, b_rs: usize, c: &mut [f32], m: usize, k: usize, n: usize, threads: usize) {
    let product = Gemm::new(m, n, k);
    let product = if threads > 1 { product.on_rayon(threads) } else { product };
    // What `gemm` reads and writes through its pointers, checked here (it checks nothing).
    assert!(a.len() >= m * k && c.len() >= m * n);
    assert!(k == 0 || n == 0 || (k - 1) * b_rs + (n - 1) * b_cs < b.len());
    // SAFETY: C (m x n, rows of n), A (m x k, rows of k) and B (element (i, j) at i * b_rs +
    // j * b_cs) lie inside their slices (asserted above); C is the only one written, and it is
    // borrowed mutably, so nothing else reads it meanwhile.
    unsafe { product.run(Strided::rows(c.as_mut_ptr(), n), Strided::rows(a.as_ptr(), k), Strided::with_strides(b.as_ptr(), b_cs, b_rs)) }
}

/// CPU seconds used by this process (all threads). On a shared machine, flop / CPU-second is the
/// per-core speed whatever share of the cores we were given (rayon's spinning counts against us).
fn cpu_s() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec for the call to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(7);
    // Optional second argument: only shapes whose "M×K×N" contains it.
    let filter = std::env::args().nth(2).unwrap_or_default();
    println!("bf16 fast path in use: {} ({})", bf16::native(), moge::model::cpu::route_description(moge::model::Precision::Bf16));
    // (M, K, N, conv?) — conv: A = weights (M = cout), B = im2col (K = cin·9, N = pixels).
    let shapes: &[(usize, usize, usize, bool)] = &[
        (120, 256, 512, false), // everything L2-resident: close to the microkernel's own speed
        (1800, 384, 1152, false),
        (1800, 1536, 384, false),
        (1800, 1024, 4096, false),
        (1800, 4096, 1024, false),
        (64, 576, 4096, true),
        (32, 576, 16384, true),
        (256, 2304, 2048, true),
        // conv3x3.rs tiles: im2col of ~1 MiB per call (L2-resident, as when just unfolded).
        (64, 576, 448, true),
        (256, 2304, 112, true),
    ];
    // What bf16 inputs cost in accuracy (vs the exact product of the f32 inputs), U(-1,1) data.
    {
        let (m, k, n) = (64, 1024, 256);
        let a = Rng::new(12345).units(m * k);
        let b = Rng::new(67890).units(k * n);
        let mut c = vec![0f32; m * n];
        bf16::gemm_bf16(Mat::from_slice(&a, m, k, k), &PackedB::from_f32_kn(&b, k, n), Mat::from_slice_mut(&mut c, m, n, n), false, 1);
        let (mut emax, mut e2, mut r2, mut rmax) = (0f64, 0f64, 0f64, 0f64);
        for i in 0..m {
            for j in 0..n {
                let r: f64 = (0..k).map(|t| a[i * k + t] as f64 * b[t * n + j] as f64).sum();
                let e = c[i * n + j] as f64 - r;
                (emax, rmax) = (emax.max(e.abs()), rmax.max(r.abs()));
                (e2, r2) = (e2 + e * e, r2 + r * r);
            }
        }
        println!("bf16 vs exact f32 inputs, {m}×{k}×{n}: max |err| / max |C| = {:.2e}, rms err / rms C = {:.2e}", emax / rmax, (e2 / r2).sqrt());
    }
    println!("GFLOP/s: wall-clock median and best of the reps; 'core' = flop per CPU-second of the");
    println!("process (per-core speed, robust to other load). ratio = bf16/f32 wall medians.");
    println!(
        "{:>15} {:>3} | {:>8} {:>8} {:>6} | {:>8} {:>8} {:>6} | {:>6} | {:>7}",
        "M×K×N", "thr", "bf16 med", "best", "core", "f32 med", "best", "core", "ratio", "pack ms"
    );
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    for &(m, k, n, conv) in shapes {
        if !format!("{m}×{k}×{n}").contains(&filter) {
            continue;
        }
        let a = rng.units(m * k);
        // ViT: b is a Linear weight (out = N, in = K) → `PackedB::from_f32_nk`; conv: b is the
        // K×N im2col.
        let b = rng.units(k * n);
        let (b_cs, b_rs) = if conv { (1, n) } else { (k, 1) };
        let mut c = vec![0f32; m * n];
        let flop = 2.0 * (m * n * k) as f64;
        // One-time weight packing (not part of the per-call numbers).
        let t = Instant::now();
        let (pa, pb) = if conv { (Some(PackedA::from_f32(&a, m, k)), None) } else { (None, Some(PackedB::from_f32_nk(&b, n, k))) };
        let pack_ms = t.elapsed().as_secs_f64() * 1e3;
        for threads in [2usize, 1] {
            let run_bf16 = |c: &mut [f32]| {
                if let Some(pa) = &pa {
                    bf16::gemm_bf16_packed_a(pa, Mat::from_slice(&b, k, n, n), Mat::from_slice_mut(c, m, n, n), false, threads);
                } else {
                    bf16::gemm_bf16(Mat::from_slice(&a, m, k, k), pb.as_ref().unwrap(), Mat::from_slice_mut(c, m, n, n), false, threads);
                }
            };
            run_bf16(&mut c);
            f32_gemm(&a, &b, b_cs, b_rs, &mut c, m, k, n, threads);
            let (mut tb, mut tf, mut cb, mut cf) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..reps {
                let (t, u) = (Instant::now(), cpu_s());
                run_bf16(&mut c);
                tb.push(flop / t.elapsed().as_secs_f64() / 1e9);
                cb.push(flop / (cpu_s() - u) / 1e9);
                let (t, u) = (Instant::now(), cpu_s());
                f32_gemm(&a, &b, b_cs, b_rs, &mut c, m, k, n, threads);
                tf.push(flop / t.elapsed().as_secs_f64() / 1e9);
                cf.push(flop / (cpu_s() - u) / 1e9);
            }
            let (cbm, cfm) = (median(&mut cb), median(&mut cf));
            let (bb, fb) = (tb.iter().cloned().fold(0.0, f64::max), tf.iter().cloned().fold(0.0, f64::max));
            let (bm, fm) = (median(&mut tb), median(&mut tf));
            println!(
                "{:>15} {:>3} | {:>8.1} {:>8.1} {:>6.1} | {:>8.1} {:>8.1} {:>6.1} | {:>5.2}× | {:>7.2}",
                format!("{m}×{k}×{n}"),
                threads,
                bm,
                bb,
                cbm,
                fm,
                fb,
                cfm,
                bm / fm,
                pack_ms
            );
        }
    }
}
