//! What the benchmark examples share: deterministic inputs, the median, and the allocator
//! settings of the `moge` binary (`keep_freed_memory` in `src/main.rs`), so that freed buffers
//! are reused as in a forward.
#![allow(dead_code)]

/// `n` values in [-1, 1) from a xorshift generator: the same inputs every run.
pub fn rand_vec(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub fn median(t: &mut [f64]) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// One malloc arena, no mmap for large blocks, no trimming: as the `moge` binary.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
