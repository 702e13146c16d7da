//! The one door to the `gemm` crate's f32 product, which picks its own SIMD at run time (the
//! route where no kernel of ours runs: linears and attention off the one-tap levels, im2col,
//! 1x1 convolutions, bf16 emulated). `gemm::gemm` takes 19 positional arguments; [`Gemm`]
//! names them once, and passes them through unchanged.

/// A matrix operand by its first element and the distance, in elements, from one column to
/// the next and from one row to the next (the `gemm` crate's `cs` and `rs`).
#[derive(Clone, Copy, Debug)]
pub struct Strided<P> {
    pub ptr: P,
    pub col_stride: isize,
    pub row_stride: isize,
}

impl<P> Strided<P> {
    /// Row-major: columns side by side, rows `ld` apart.
    pub fn rows(ptr: P, ld: usize) -> Self {
        Self { ptr, col_stride: 1, row_stride: ld as isize }
    }

    /// Column-major: rows side by side, columns `ld` apart (a row-major matrix read
    /// transposed, e.g. a linear's (out, in) weight as (in × out)).
    pub fn cols(ptr: P, ld: usize) -> Self {
        Self { ptr, col_stride: ld as isize, row_stride: 1 }
    }

    /// Columns `col_stride` and rows `row_stride` apart.
    pub fn with_strides(ptr: P, col_stride: usize, row_stride: usize) -> Self {
        Self { ptr, col_stride: col_stride as isize, row_stride: row_stride as isize }
    }
}

/// `dst (m × n) = [dst +] scale · lhs (m × k) · rhs (k × n)`, built up and then [`Gemm::run`].
#[derive(Clone, Copy, Debug)]
pub struct Gemm {
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
    scale: f32,
    parallelism: ::gemm::Parallelism,
}

impl Gemm {
    /// The product of an (m × k) and a (k × n) matrix into an (m × n) one, overwriting it, at
    /// scale 1, on this thread.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Self { m, n, k, accumulate: false, scale: 1.0, parallelism: ::gemm::Parallelism::None }
    }

    /// Adds the product to dst (`read_dst`) instead of writing it over dst, which is then not
    /// read.
    pub fn accumulate(self, accumulate: bool) -> Self {
        Self { accumulate, ..self }
    }

    /// The factor of the product (the crate's `beta`).
    pub fn scale(self, scale: f32) -> Self {
        Self { scale, ..self }
    }

    /// On the rayon pool, in up to `threads` tasks.
    pub fn on_rayon(self, threads: usize) -> Self {
        Self { parallelism: ::gemm::Parallelism::Rayon(threads), ..self }
    }

    /// Runs the product. dst's factor (the crate's `alpha`) is 1 when accumulating and 0
    /// otherwise, where the crate does not read it; nothing is conjugated.
    ///
    /// # Safety
    /// `dst` must address m × n elements valid for reads and writes at its strides, `lhs`
    /// m × k and `rhs` k × n valid for reads at theirs; nothing else may reach dst's elements
    /// during the call (the crate checks none of this).
    pub unsafe fn run(self, dst: Strided<*mut f32>, lhs: Strided<*const f32>, rhs: Strided<*const f32>) {
        let alpha = if self.accumulate { 1.0 } else { 0.0 };
        // SAFETY: the caller's contract above is the crate's.
        unsafe {
            ::gemm::gemm(
                self.m,
                self.n,
                self.k,
                dst.ptr,
                dst.col_stride,
                dst.row_stride,
                self.accumulate,
                lhs.ptr,
                lhs.col_stride,
                lhs.row_stride,
                rhs.ptr,
                rhs.col_stride,
                rhs.row_stride,
                alpha,
                self.scale,
                false,
                false,
                false,
                self.parallelism,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::test_values;

    /// Every operand layout the call sites use (row-major, column-major, a stride of each),
    /// overwriting and accumulating, scaled, on this thread and on the pool, against an f64
    /// product.
    #[test]
    fn matches_a_reference_in_every_layout() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let (m, n, k) = (7, 19, 13);
        let lhs = test_values(&mut seed, m * k);
        // rhs (k × n) stored row-major (rows n apart) and column-major (columns k apart).
        let rhs = test_values(&mut seed, k * n);
        let rhs_t: Vec<f32> = (0..n).flat_map(|j| (0..k).map(|i| rhs[i * n + j]).collect::<Vec<_>>()).collect();
        let start = test_values(&mut seed, m * n);
        for (accumulate, scale, threads) in [(false, 1.0, 1), (true, 1.0, 1), (false, 0.5, 3), (true, -2.0, 2)] {
            for transposed in [false, true] {
                let mut dst = start.clone();
                let product = Gemm::new(m, n, k).accumulate(accumulate).scale(scale);
                let product = if threads > 1 { product.on_rayon(threads) } else { product };
                let rhs_op = if transposed { Strided::cols(rhs_t.as_ptr(), k) } else { Strided::rows(rhs.as_ptr(), n) };
                // SAFETY: dst holds m rows of n, lhs m rows of k, rhs k × n in either layout.
                unsafe { product.run(Strided::rows(dst.as_mut_ptr(), n), Strided::rows(lhs.as_ptr(), k), rhs_op) };
                for i in 0..m {
                    for j in 0..n {
                        let dot: f64 = (0..k).map(|p| lhs[i * k + p] as f64 * rhs[p * n + j] as f64).sum();
                        let want = scale as f64 * dot + if accumulate { start[i * n + j] as f64 } else { 0.0 };
                        let got = dst[i * n + j] as f64;
                        assert!((got - want).abs() < 1e-5 * (1.0 + want.abs()), "[{i}, {j}] {accumulate} {scale} {transposed}: {got} vs {want}");
                    }
                }
            }
        }
    }
}
