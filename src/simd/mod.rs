//! The SIMD layer: the bottom of the crate, importing nothing from the modules above it, and
//! printing nothing (an ignored `MOGE_MAX_CPU_ISA` is the caller's to warn of).
//!
//! - [`isa`]: the instruction-set level, detected once, capped by `MOGE_MAX_CPU_ISA`, and
//!   overridden per thread by `isa::with_isa`; every kernel and vector loop takes its route from
//!   here.
//! - `dispatch!`: a loop body compiled for the baseline, AVX2 and AVX-512F, called by level
//!   (the model's elementwise maths, and the host's resizes, post-processing and encoders).
//! - [`math`]: exp, GELU and softmax, written to vectorise.
//! - [`mat`]: [`Mat`], a matrix operand (start, rows, columns, row stride) as one value: the
//!   kernels' operands, checked over a slice or raw for the kernels themselves.
//! - [`tiles`]: Intel AMX's tile operations behind one trait, done by the hardware (`amx`,
//!   where the kernel grants the tile state) or emulated in plain Rust (every machine's tests).
//! - [`sgemm`]: f32 products on the one-tap register-tile kernels, one file per instruction set
//!   (`avx2`, `avx512`, `neon`), shared by the linears, attention, the 1x1 and transposed convolutions
//!   and Winograd; the AVX2 kernel also runs the 3x3 convolution's direct route.
//!
//! Kernels of one layer stay beside it (`model::cpu`: the direct 3x3 convolution's AVX-512
//! kernels, Winograd's transforms, the bf16 products).

#[cfg(target_arch = "x86_64")]
pub mod amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
mod dispatch;
pub mod isa;
pub mod mat;
pub mod math;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
pub mod sgemm;
pub mod tiles;

pub(crate) use dispatch::dispatch;
pub use dispatch::route;
pub use mat::{Mat, MatMut, MatRef};

/// `f` on this thread's value in `key` (a kernel's scratch, kept between calls), or on a fresh
/// one where the thread is inside `f` already (a task that waited on rayon and was handed
/// another: nothing does that today, but a borrow must not panic if it ever does).
pub(crate) fn with_local<T: Default, R>(key: &'static std::thread::LocalKey<std::cell::RefCell<T>>, f: impl FnOnce(&mut T) -> R) -> R {
    key.with(|c| match c.try_borrow_mut() {
        Ok(mut v) => f(&mut v),
        Err(_) => f(&mut T::default()),
    })
}

/// One cache line of 4-byte values: the unit of [`Lines`].
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line<T>([T; 16]);

/// Zeroed storage of 4-byte values (f32, or the bf16 pairs' u32 words) that starts on a cache
/// line. A packed operand's rows are read as whole vectors; from a plain `Vec` (16 bytes past a
/// line, as glibc's large blocks are), every 64-byte row straddled two lines, two loads for one
/// on Intel's cores, and an AMX tile load ran 6x slower (`examples/amx_peak.rs`).
#[derive(Clone)]
pub(crate) struct Lines<T: Copy + Default = f32> {
    lines: Vec<Line<T>>,
    len: usize,
}

impl<T: Copy + Default> Lines<T> {
    pub(crate) fn zeros(len: usize) -> Self {
        const { assert!(size_of::<T>() == 4) };
        Self { lines: vec![Line([T::default(); 16]); len.div_ceil(16)], len }
    }
}

impl<T: Copy + Default> Lines<T> {
    /// Replaces the values with `len` written by `fill`, given the first's address (on a
    /// cache line), without zeroing them first (a 15 MB buffer took a millisecond on one
    /// thread).
    ///
    /// # Safety
    /// `fill` writes all `len` values at the address it is given, and reads none it has not
    /// written.
    pub(crate) unsafe fn fill_uninit(&mut self, len: usize, fill: impl FnOnce(*mut T)) {
        let mut lines: Vec<Line<T>> = Vec::with_capacity(len.div_ceil(16));
        fill(lines.as_mut_ptr() as *mut T);
        // SAFETY: `fill` wrote the `len` values (the caller's promise); the last line's values
        // past `len` are never read (`deref` stops at `len`) but are set, to keep every line
        // initialised.
        unsafe {
            let p = lines.as_mut_ptr() as *mut T;
            for i in len..len.div_ceil(16) * 16 {
                p.add(i).write(T::default());
            }
            lines.set_len(len.div_ceil(16));
        }
        *self = Self { lines, len };
    }
}

impl<T: Copy + Default> Default for Lines<T> {
    fn default() -> Self {
        Self::zeros(0)
    }
}

impl<T: Copy + Default> std::fmt::Debug for Lines<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lines({} values)", self.len)
    }
}

impl<T: Copy + Default> std::ops::Deref for Lines<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `lines` holds at least `len` contiguous, initialised values (`Line` is 16 of
        // them, no padding, `len.div_ceil(16)` lines), borrowed for as long as the result.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const T, self.len) }
    }
}

impl<T: Copy + Default> std::ops::DerefMut for Lines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as `deref`, borrowed mutably for as long as the result.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut T, self.len) }
    }
}

/// A raw output pointer shared by parallel tasks that write disjoint parts of one buffer.
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: a `SendPtr` only carries an address between threads; every write through it is in an
// unsafe block of its own, whose task owns the part it writes (each user says why).
unsafe impl Send for SendPtr {}
// SAFETY: as `Send`: sharing the address reads nothing through it.
unsafe impl Sync for SendPtr {}
impl SendPtr {
    /// A method (not field access) so closures capture the whole `Sync` wrapper.
    pub(crate) fn get(&self) -> *mut f32 {
        self.0
    }
}

/// `n` values in [-1, 1) from the tests' generator (`test_rng`) started at `seed`, which then
/// moves on: the kernels' tests' inputs.
#[cfg(test)]
pub(crate) fn test_values(seed: &mut u64, n: usize) -> Vec<f32> {
    let mut rng = crate::test_rng::Rng::new(*seed);
    let values = rng.units(n);
    *seed = rng.next_u64();
    values
}
