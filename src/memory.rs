//! The process's allocator, set for forwards: a choice for programs whose job is predicting (the
//! command line, a Ray actor, a Spark worker), never made by the library on its own.

/// Keeps freed memory in the process (glibc), for the rest of its life.
///
/// glibc returns every large buffer to the kernel with munmap, so each forward re-faults its
/// tens of megabytes of temporaries page by page (632 → 495 ms per ViT-L block when this is
/// off). Keep freed memory in the process instead.
///
/// One arena: a thread other than main (the pipeline's device worker) otherwise gets its own
/// arena, whose heaps are capped at 64 MiB, so the largest activations still go through
/// mmap/munmap there whatever M_MMAP_MAX says. That cost `moge batch` 15 % of its forward speed
/// (1853 vs 1575 ms per ViT-S forward, bf16); with one arena, 1595 vs 1562 ms.
///
/// The cost: the process keeps its peak footprint until it exits. Elsewhere than glibc, nothing.
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
