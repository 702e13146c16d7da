fn main() {
    keep_freed_memory();
    std::process::exit(moge::cli::main());
}

/// glibc returns every large buffer to the kernel with munmap, so each forward re-faults its
/// tens of megabytes of temporaries page by page (runtime.md §2.2: 632 → 495 ms per ViT-L block
/// when this is off). Keep freed memory in the process instead.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
