//! [`Mat`]: one matrix operand as one value (where its elements are, how many rows and columns,
//! how far apart its rows are), where the kernels took a pointer, two counts and a stride for
//! each operand.
//!
//! Element (r, c) is at `r · stride + c` from the start: columns are always adjacent, rows
//! `stride` elements apart (0 repeats one row on every row: a bias added to each row of a tile).
//! What the start is decides what a view promises:
//! - `Mat<&[T]>` and `Mat<&mut [T]>` borrow a slice, and their constructors assert that it holds
//!   every element: safe code reads and writes them through checked rows.
//! - `Mat<*const T>` and `Mat<*mut T>` ([`MatRef`], [`MatMut`]) are raw, for the kernels. Like
//!   raw pointers they borrow nothing and are `Copy`: parallel tasks share one output and write
//!   disjoint parts of it. Making one, or moving one to a part of itself, is safe (the
//!   arithmetic wraps and reads nothing); reading or writing through one is the unsafe part,
//!   and a kernel's `# Safety` says which elements (or which readable margin past them) must
//!   be there.
//!
//! Every accessor is `#[inline(always)]`: a kernel's view is its pointer and stride in
//! registers, the same work as the separate arguments it replaced.

/// A `rows × cols` matrix, rows `stride` elements apart, held by `P`: a slice (`&[T]`,
/// `&mut [T]`) or a raw pointer (`*const T`, `*mut T`). See the module's documentation.
#[derive(Clone, Copy, Debug)]
pub struct Mat<P> {
    data: P,
    rows: usize,
    cols: usize,
    stride: usize,
}

/// A raw view for reading (see [`Mat`]).
pub type MatRef<T> = Mat<*const T>;

/// A raw view for writing (see [`Mat`]).
pub type MatMut<T> = Mat<*mut T>;

/// Elements from the start of row 0 to the end of the last row: what a slice must hold.
#[inline(always)]
fn extent(rows: usize, cols: usize, stride: usize) -> usize {
    if rows == 0 {
        0
    } else {
        (rows - 1) * stride + cols
    }
}

impl<P> Mat<P> {
    #[inline(always)]
    pub fn rows(&self) -> usize {
        self.rows
    }

    #[inline(always)]
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Elements from the start of one row to the start of the next.
    #[inline(always)]
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// The part [r0, r0 + rows) × [c0, c0 + cols) of the shape, asserted inside it.
    #[inline(always)]
    fn check_block(&self, r0: usize, c0: usize, rows: usize, cols: usize) {
        assert!(r0 + rows <= self.rows && c0 + cols <= self.cols, "Mat: block {rows}x{cols} at ({r0}, {c0}) of {}x{}", self.rows, self.cols);
    }
}

impl<'a, T> Mat<&'a [T]> {
    /// `rows × cols` elements of `data`, rows `stride` apart; panics where `data` is too short.
    #[inline(always)]
    pub fn from_slice(data: &'a [T], rows: usize, cols: usize, stride: usize) -> Self {
        assert!(data.len() >= extent(rows, cols, stride), "Mat: {} elements for {rows}x{cols} rows {stride} apart", data.len());
        Self { data, rows, cols, stride }
    }

    /// Row `r` (`cols` elements).
    #[inline(always)]
    pub fn row(&self, r: usize) -> &'a [T] {
        assert!(r < self.rows, "Mat: row {r} of {}", self.rows);
        &self.data[r * self.stride..][..self.cols]
    }

    /// The part [r0, r0 + rows) × [c0, c0 + cols), which must lie inside.
    #[inline(always)]
    pub fn block(&self, r0: usize, c0: usize, rows: usize, cols: usize) -> Self {
        self.check_block(r0, c0, rows, cols);
        let data = if rows == 0 { &self.data[..0] } else { &self.data[r0 * self.stride + c0..] };
        Self { data, rows, cols, stride: self.stride }
    }

    /// The raw view of the same elements, for a kernel; it is readable as long as `'a` lasts.
    #[inline(always)]
    pub fn as_raw(&self) -> MatRef<T> {
        Mat { data: self.data.as_ptr(), rows: self.rows, cols: self.cols, stride: self.stride }
    }
}

impl<'a, T> Mat<&'a mut [T]> {
    /// `rows × cols` elements of `data`, rows `stride` apart; panics where `data` is too short
    /// or the rows overlap (stride < cols), so that disjoint rows are disjoint memory.
    #[inline(always)]
    pub fn from_slice_mut(data: &'a mut [T], rows: usize, cols: usize, stride: usize) -> Self {
        assert!(data.len() >= extent(rows, cols, stride), "Mat: {} elements for {rows}x{cols} rows {stride} apart", data.len());
        assert!(rows <= 1 || stride >= cols, "Mat: rows of {cols} overlap {stride} apart");
        Self { data, rows, cols, stride }
    }

    /// Row `r` (`cols` elements).
    #[inline(always)]
    pub fn row(&self, r: usize) -> &[T] {
        assert!(r < self.rows, "Mat: row {r} of {}", self.rows);
        &self.data[r * self.stride..][..self.cols]
    }

    /// Row `r` (`cols` elements), to write.
    #[inline(always)]
    pub fn row_mut(&mut self, r: usize) -> &mut [T] {
        assert!(r < self.rows, "Mat: row {r} of {}", self.rows);
        &mut self.data[r * self.stride..][..self.cols]
    }

    /// The same elements, read-only, for as long as this borrow.
    #[inline(always)]
    pub fn rb(&self) -> Mat<&[T]> {
        Mat { data: &*self.data, rows: self.rows, cols: self.cols, stride: self.stride }
    }

    /// The same elements, to write, for as long as this borrow (to pass on and use again).
    #[inline(always)]
    pub fn rb_mut(&mut self) -> Mat<&mut [T]> {
        Mat { data: &mut *self.data, rows: self.rows, cols: self.cols, stride: self.stride }
    }

    /// The raw view of the same elements, for a kernel; it is writable for as long as this
    /// borrow lasts, and nothing else reaches them meanwhile.
    #[inline(always)]
    pub fn as_raw_mut(&mut self) -> MatMut<T> {
        Mat { data: self.data.as_mut_ptr(), rows: self.rows, cols: self.cols, stride: self.stride }
    }
}

/// The accessors of both raw views, on the pointer type `$p` (`*const T` or `*mut T`).
macro_rules! raw_view {
    ($p:ty, $new:ident) => {
        impl<T> Mat<$p> {
            /// A view of `rows × cols` elements from `ptr`, rows `stride` apart. Nothing is read
            /// or checked: whoever reads or writes through it answers for the memory.
            #[inline(always)]
            pub fn $new(ptr: $p, rows: usize, cols: usize, stride: usize) -> Self {
                Self { data: ptr, rows, cols, stride }
            }

            /// Element (0, 0).
            #[inline(always)]
            pub fn ptr(&self) -> $p {
                self.data
            }

            /// The start of row `r`.
            #[inline(always)]
            pub fn row(&self, r: usize) -> $p {
                self.data.wrapping_add(r * self.stride)
            }

            /// Element (r, c).
            #[inline(always)]
            pub fn at(&self, r: usize, c: usize) -> $p {
                self.data.wrapping_add(r * self.stride + c)
            }

            /// The part [r0, r0 + rows) × [c0, c0 + cols), which must lie inside (asserted).
            #[inline(always)]
            pub fn block(&self, r0: usize, c0: usize, rows: usize, cols: usize) -> Self {
                self.check_block(r0, c0, rows, cols);
                Self { data: self.at(r0, c0), rows, cols, stride: self.stride }
            }

            /// The same view with another shape: `rows × cols` from the same start, rows
            /// `stride` apart (a tile's full width where the kernel reads past the last
            /// column it keeps, for one).
            #[inline(always)]
            pub fn reshaped(&self, rows: usize, cols: usize, stride: usize) -> Self {
                Self { data: self.data, rows, cols, stride }
            }
        }
    };
}
raw_view!(*const T, from_ptr);
raw_view!(*mut T, from_mut_ptr);

impl<T> MatRef<T> {
    /// The same elements read as `U`, of `T`'s size (f32 values as their bits, or back).
    #[inline(always)]
    pub fn cast<U>(&self) -> MatRef<U> {
        const { assert!(size_of::<T>() == size_of::<U>()) };
        Mat { data: self.data as *const U, rows: self.rows, cols: self.cols, stride: self.stride }
    }
}

impl MatMut<f32> {
    /// Asks for the cache lines of rows `rows`, `n` floats from column `col`, in the writable
    /// state (`prefetchw` on x86-64; nothing elsewhere): a hint, which reads and writes nothing
    /// and never faults, for an epilogue whose stores would otherwise wait on their lines.
    #[inline]
    pub fn prefetch_for_write(&self, rows: std::ops::Range<usize>, col: usize, n: usize) {
        #[cfg(target_arch = "x86_64")]
        if n > 0 {
            for r in rows {
                let first = self.at(r, col) as usize;
                // Every line from the first float's to the last's.
                for line in (first & !63..=(first + 4 * n - 1) & !63).step_by(64) {
                    // SAFETY: a prefetch has no architectural effect (it cannot fault, whatever
                    // the address); SSE is part of x86-64.
                    unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_ET0 }>(line as *const i8) };
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (rows, col, n);
    }
}

impl<T> MatMut<T> {
    /// The same elements, to read.
    #[inline(always)]
    pub fn as_const(&self) -> MatRef<T> {
        Mat { data: self.data as *const T, rows: self.rows, cols: self.cols, stride: self.stride }
    }
}

/// Cache lines a kernel requests into L2 as it goes, one per inner index: `count` lines of 16
/// floats from `start` (a hint: it reads nothing and never faults).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct Prefetch {
    pub(crate) start: *const f32,
    pub(crate) count: usize,
}

impl Prefetch {
    /// No request.
    pub(crate) const NONE: Prefetch = Prefetch { start: std::ptr::null(), count: 0 };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_views_index_rows_and_blocks() {
        let v: Vec<u32> = (0..20).collect();
        let m = Mat::from_slice(&v, 3, 4, 7);
        assert_eq!(m.row(2), &[14, 15, 16, 17]);
        let b = m.block(1, 2, 2, 2);
        assert_eq!((b.rows(), b.cols(), b.stride()), (2, 2, 7));
        assert_eq!((b.row(0), b.row(1)), (&[9, 10][..], &[16, 17][..]));
        assert_eq!(m.block(3, 4, 0, 0).rows(), 0);
        // Stride 0: every row is the first.
        assert_eq!(Mat::from_slice(&v[..3], 5, 3, 0).row(4), &[0, 1, 2]);
        // The raw view reaches the same elements.
        let r = b.as_raw();
        // SAFETY: `b` is a view of `v`, alive here; (1, 1) is inside it.
        assert_eq!(unsafe { *r.at(1, 1) }, 17);
        assert_eq!(r.row(1), r.at(1, 0));
    }

    #[test]
    fn mutable_views_write_their_rows() {
        let mut v = vec![0f32; 12];
        let mut m = Mat::from_slice_mut(&mut v, 2, 3, 5);
        m.row_mut(1).copy_from_slice(&[1.0, 2.0, 3.0]);
        assert_eq!(m.rb().row(1), &[1.0, 2.0, 3.0]);
        let raw = m.as_raw_mut().block(1, 1, 1, 2);
        // SAFETY: `raw` is inside `m`'s elements, borrowed mutably here and not used meanwhile.
        unsafe { *raw.at(0, 1) = 9.0 };
        assert_eq!(v, [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 9.0, 0.0, 0.0, 0.0, 0.0]);
    }

    /// The prefetch is a hint: it changes nothing, for rows and columns inside the view or
    /// past its end (the tile epilogues ask for whole groups' lines at the edges).
    #[test]
    fn prefetch_for_write_changes_nothing() {
        let mut v: Vec<f32> = (0..40).map(|i| i as f32).collect();
        let m = Mat::from_slice_mut(&mut v, 4, 10, 10).as_raw_mut();
        m.prefetch_for_write(0..4, 0, 10);
        m.prefetch_for_write(2..8, 7, 32);
        m.prefetch_for_write(1..3, 5, 0);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as f32));
    }

    #[test]
    #[should_panic(expected = "Mat: 11 elements for 2x3 rows 9 apart")]
    fn a_short_slice_is_refused() {
        let v = [0u8; 11];
        let _ = Mat::from_slice(&v, 2, 3, 9);
    }

    #[test]
    #[should_panic(expected = "Mat: block")]
    fn a_block_outside_is_refused() {
        let v = [0u8; 16];
        let _ = Mat::from_ptr(v.as_ptr(), 4, 4, 4).block(2, 1, 3, 1);
    }
}
