//! The f32 FMA peak of this machine's cores, the yardstick of the "% of peak" figures in
//! PERFORMANCE.md: 12 independent chains of 8-lane FMAs (enough to cover the latency of two
//! FMA pipes) per thread, on 1 thread and on every core, three times each; then 16 chains of
//! 16-lane AVX-512F FMAs where the CPU has them (at 24, LLVM spilled some to the stack).
//!
//! `cargo run --release --example fma_peak`

/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chains(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_set1_ps(1.0); 12];
    let (b, c) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, b, c);
        }
    }
    // The sum keeps the loop from being optimised away.
    let mut lanes = [0f32; 8];
    acc.iter()
        .map(|&a| {
            // SAFETY: `lanes` holds the 8 floats stored.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), a) };
            lanes.iter().sum::<f32>()
        })
        .sum()
}

/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chains512(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(1.0); 16];
    let (b, c) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, b, c);
        }
    }
    acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
}

#[cfg(target_arch = "x86_64")]
fn main() {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        println!("no AVX2 + FMA on this CPU");
        return;
    }
    let iters = 200_000_000usize;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [1, cores] {
        for _ in 0..3 {
            let t = std::time::Instant::now();
            // SAFETY: AVX2 and FMA were detected above.
            let hs: Vec<_> = (0..threads).map(|_| std::thread::spawn(move || unsafe { chains(iters) })).collect();
            let check: f32 = hs.into_iter().map(|h| h.join().expect("an FMA thread")).sum();
            let flops = (threads * iters * 12 * 8 * 2) as f64;
            println!("AVX2 f32 FMA, {threads} thread(s): {:.1} GFLOP/s (check {check:.3})", flops / t.elapsed().as_secs_f64() / 1e9);
        }
    }
    if !is_x86_feature_detected!("avx512f") {
        return;
    }
    let iters = iters / 4;
    for threads in [1, cores] {
        for _ in 0..3 {
            let t = std::time::Instant::now();
            // SAFETY: AVX-512F was detected above.
            let hs: Vec<_> = (0..threads).map(|_| std::thread::spawn(move || unsafe { chains512(iters) })).collect();
            let check: f32 = hs.into_iter().map(|h| h.join().expect("an FMA thread")).sum();
            let flops = (threads * iters * 16 * 16 * 2) as f64;
            println!("AVX-512F f32 FMA, {threads} thread(s): {:.1} GFLOP/s (check {check:.3})", flops / t.elapsed().as_secs_f64() / 1e9);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("x86-64 only");
}
