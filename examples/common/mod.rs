//! What the benchmark examples share: deterministic inputs (the tests' generator), the median,
//! and the allocator settings of the `moge` binary (`keep_freed_memory` in `src/main.rs`), so
//! that freed buffers are reused as in a forward.
// Each example compiles this module and uses only part of it.
#![allow(dead_code)]

/// The tests' seeded generator: the same inputs every run.
#[path = "../../tests/it/support/rng.rs"]
pub mod rng;

pub fn median(t: &mut [f64]) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// One malloc arena, no mmap for large blocks, no trimming: as the `moge` binary.
pub fn keep_freed_memory() {
    // SAFETY: mallopt only sets glibc's allocator parameters (valid ones, with valid values),
    // under the allocator's own lock; it touches no memory of ours.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
