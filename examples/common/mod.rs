//! What the benchmark examples share: deterministic inputs (the tests' generator), the median,
//! and the allocator settings of the `moge` binary (`moge::memory::keep_freed_memory`), so that
//! freed buffers are reused as in a forward.
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
    moge::memory::keep_freed_memory();
}
