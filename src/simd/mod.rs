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
//! - [`sgemm`]: f32 products on the one-tap register-tile kernels, one file per instruction set
//!   (`avx2`, `avx512`), shared by the linears, attention, the 1x1 and transposed convolutions
//!   and Winograd; the AVX2 kernel also runs the 3x3 convolution's direct route.
//!
//! Kernels of one layer stay beside it (`model::cpu`: the direct 3x3 convolution's AVX-512
//! kernels, Winograd's transforms, the bf16 products).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
mod dispatch;
pub mod isa;
pub mod mat;
pub mod math;
pub mod sgemm;

pub(crate) use dispatch::dispatch;
pub use dispatch::route;
pub use mat::{Mat, MatMut, MatRef};

/// One cache line of floats: the unit of [`Lines`].
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// Zeroed f32 storage that starts on a cache line. A packed operand's rows are read as whole
/// vectors; from a plain `Vec` (16 bytes past a line, as glibc's large blocks are), every
/// 64-byte row straddled two lines, two loads for one on Intel's cores.
pub(crate) struct Lines {
    lines: Vec<Line>,
    len: usize,
}

impl Lines {
    pub(crate) fn zeros(len: usize) -> Self {
        Self { lines: vec![Line([0.0; 16]); len.div_ceil(16)], len }
    }
}

impl std::ops::Deref for Lines {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `lines` holds at least `len` contiguous, initialised floats (`Line` is 16 of
        // them, no padding, `len.div_ceil(16)` lines), borrowed for as long as the result.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const f32, self.len) }
    }
}

impl std::ops::DerefMut for Lines {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as `deref`, borrowed mutably for as long as the result.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut f32, self.len) }
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
