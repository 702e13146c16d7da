//! The `moge` command line ([`cli`]) over the `moge` library.

mod cli;

fn main() {
    keep_freed_memory();
    std::process::exit(cli::main());
}

/// glibc returns every large buffer to the kernel with munmap, so each forward re-faults its
/// tens of megabytes of temporaries page by page (632 → 495 ms per ViT-L block when this is
/// off). Keep freed memory in the process instead.
///
/// One arena: a thread other than main (the pipeline's device worker) otherwise gets its own
/// arena, whose heaps are capped at 64 MiB, so the largest activations still go through
/// mmap/munmap there whatever M_MMAP_MAX says. That cost `moge batch` 15 % of its forward speed
/// (1853 vs 1575 ms per ViT-S forward, bf16); with one arena, 1595 vs 1562 ms.
fn keep_freed_memory() {
    // SAFETY: mallopt only sets glibc's allocator parameters (valid ones, with valid values),
    // under the allocator's own lock; it touches no memory of ours.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
