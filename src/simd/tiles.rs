//! Intel AMX's tile operations behind one trait, [`TileUnit`], with two implementations: the
//! hardware ([`crate::simd::amx::Amx`], `asm!` on stable Rust) and [`Emulated`], the same
//! operations in plain Rust. A kernel written against the trait runs on either, so its packing,
//! blocking and tile loop are tested on every machine, and the hardware is tested against the
//! emulation where the CPU has AMX.
//!
//! One palette for every kernel: the eight tiles `tmm0..tmm7`, each 16 rows of 64 bytes (16 f32
//! or i32 accumulators per row, or 32 bf16 / 64 u8 or s8 inputs per row). The semantics follow
//! Intel's SDM (Vol. 2, `TDPBF16PS`, `TDPBUSD`): per row m of C and column n,
//! `C[m][n] += Σ_k A[m][k-group] · B[k-group][n]`, where a row of B holds, for each of the 16
//! columns, the 2 (bf16) or 4 (int8) consecutive k values of one group side by side.

/// Rows of every tile.
pub const ROWS: usize = 16;
/// Bytes of every tile row.
pub const ROW_BYTES: usize = 64;

/// The tile configuration `ldtilecfg` reads (Intel SDM, "TILECFG"): palette 1, and for each of
/// the eight tiles 16 rows of 64 bytes.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
pub(crate) struct Palette {
    pub palette_id: u8,
    pub start_row: u8,
    pub reserved: [u8; 14],
    pub colsb: [u16; 16],
    pub rows: [u8; 16],
}

#[cfg(target_arch = "x86_64")]
impl Palette {
    pub(crate) const fn eight_full_tiles() -> Self {
        let mut colsb = [0u16; 16];
        let mut rows = [0u8; 16];
        let mut t = 0;
        while t < 8 {
            colsb[t] = ROW_BYTES as u16;
            rows[t] = ROWS as u8;
            t += 1;
        }
        Palette { palette_id: 1, start_row: 0, reserved: [0; 14], colsb, rows }
    }
}

/// The tile operations the kernels use, on tile registers named by a const generic (0..8).
///
/// # Safety
/// Every method reads (`load`) or writes (`store`) 16 rows of 64 bytes at `ptr + r · stride`:
/// the caller promises those bytes are readable (writable). On the hardware, a value of the
/// type exists only where the process may use the tiles and this thread has loaded the palette
/// (`Amx::new`).
pub trait TileUnit {
    /// Whether the CPU running this unit has AVX-512F (every CPU with AMX does; the emulation
    /// assumes nothing), so that the kernels' epilogues may use it.
    const AVX512: bool;
    /// Tile `T` = the 16 rows of 64 bytes at `ptr`, `stride` bytes apart.
    ///
    /// # Safety
    /// Those bytes are readable.
    unsafe fn load<const T: usize>(&mut self, ptr: *const u8, stride: usize);
    /// The 16 rows of 64 bytes at `ptr`, `stride` bytes apart, = tile `T`.
    ///
    /// # Safety
    /// Those bytes are writable.
    unsafe fn store<const T: usize>(&mut self, ptr: *mut u8, stride: usize);
    /// Tile `T` = 0.
    fn zero<const T: usize>(&mut self);
    /// f32 tile `C` += bf16 pairs `A` · bf16 pairs `B` (`tdpbf16ps`).
    fn dp_bf16<const C: usize, const A: usize, const B: usize>(&mut self);
    /// i32 tile `C` += u8 quads `A` · s8 quads `B` (`tdpbusd`).
    fn dp_u8s8<const C: usize, const A: usize, const B: usize>(&mut self);
    /// i32 tile `C` += s8 quads `A` · u8 quads `B` (`tdpbsud`): the convolutions', whose A
    /// is the weights.
    fn dp_s8u8<const C: usize, const A: usize, const B: usize>(&mut self);
}

/// The eight tiles in memory, each operation done in plain Rust: the portable twin of the
/// hardware, for testing the kernels on any machine (slow: never a route of its own).
pub struct Emulated {
    tiles: Box<[[u8; ROWS * ROW_BYTES]; 8]>,
}

impl Default for Emulated {
    fn default() -> Self {
        Emulated { tiles: Box::new([[0u8; ROWS * ROW_BYTES]; 8]) }
    }
}

impl Emulated {
    fn word(&self, t: usize, r: usize, i: usize) -> [u8; 4] {
        let o = r * ROW_BYTES + 4 * i;
        self.tiles[t][o..o + 4].try_into().expect("4 bytes")
    }

    fn set_word(&mut self, t: usize, r: usize, i: usize, w: [u8; 4]) {
        let o = r * ROW_BYTES + 4 * i;
        self.tiles[t][o..o + 4].copy_from_slice(&w);
    }
}

/// bf16 bits as f32, denormals read as zero (the tile unit's DAZ).
fn bf16_daz(h: u16) -> f32 {
    let x = f32::from_bits((h as u32) << 16);
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

impl TileUnit for Emulated {
    const AVX512: bool = false;
    unsafe fn load<const T: usize>(&mut self, ptr: *const u8, stride: usize) {
        for r in 0..ROWS {
            // SAFETY: the caller's promise: row r's 64 bytes are readable.
            let src = unsafe { std::slice::from_raw_parts(ptr.wrapping_add(r * stride), ROW_BYTES) };
            self.tiles[T][r * ROW_BYTES..(r + 1) * ROW_BYTES].copy_from_slice(src);
        }
    }

    unsafe fn store<const T: usize>(&mut self, ptr: *mut u8, stride: usize) {
        for r in 0..ROWS {
            // SAFETY: the caller's promise: row r's 64 bytes are writable.
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr.wrapping_add(r * stride), ROW_BYTES) };
            dst.copy_from_slice(&self.tiles[T][r * ROW_BYTES..(r + 1) * ROW_BYTES]);
        }
    }

    fn zero<const T: usize>(&mut self) {
        self.tiles[T].fill(0);
    }

    fn dp_bf16<const C: usize, const A: usize, const B: usize>(&mut self) {
        for m in 0..ROWS {
            for n in 0..ROWS {
                let mut acc = f32::from_le_bytes(self.word(C, m, n));
                for k in 0..ROWS {
                    let (a, b) = (self.word(A, m, k), self.word(B, k, n));
                    for h in 0..2 {
                        let x = bf16_daz(u16::from_le_bytes([a[2 * h], a[2 * h + 1]]));
                        let y = bf16_daz(u16::from_le_bytes([b[2 * h], b[2 * h + 1]]));
                        // A bf16 product is exact in f32; each sum rounds (the SDM's order).
                        acc += x * y;
                    }
                }
                // Results flush to zero (the unit's FTZ).
                let acc = if acc.is_subnormal() { 0.0f32.copysign(acc) } else { acc };
                self.set_word(C, m, n, acc.to_le_bytes());
            }
        }
    }

    fn dp_u8s8<const C: usize, const A: usize, const B: usize>(&mut self) {
        self.dp_bytes::<C, A, B>(|a| a as i32, |b| b as i8 as i32);
    }

    fn dp_s8u8<const C: usize, const A: usize, const B: usize>(&mut self) {
        self.dp_bytes::<C, A, B>(|a| a as i8 as i32, |b| b as i32);
    }
}

impl Emulated {
    /// i32 tile `C` += byte quads `A` · byte quads `B`, each byte read as `a` and `b` say (u8
    /// or s8): the int8 products' one loop.
    fn dp_bytes<const C: usize, const A: usize, const B: usize>(&mut self, a: fn(u8) -> i32, b: fn(u8) -> i32) {
        for m in 0..ROWS {
            for n in 0..ROWS {
                let mut acc = i32::from_le_bytes(self.word(C, m, n));
                for k in 0..ROWS {
                    let (x, y) = (self.word(A, m, k), self.word(B, k, n));
                    let dot: i32 = (0..4).map(|q| a(x[q]) * b(y[q])).sum();
                    acc = acc.wrapping_add(dot);
                }
                self.set_word(C, m, n, acc.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_palette_is_the_sdm_layout() {
        let p = Palette::eight_full_tiles();
        assert_eq!(std::mem::size_of::<Palette>(), 64);
        // SAFETY: Palette is 64 initialised bytes (repr(C), no padding between its fields).
        let bytes: [u8; 64] = unsafe { std::mem::transmute(p) };
        assert_eq!(bytes[0], 1);
        assert_eq!(&bytes[16..18], &64u16.to_le_bytes());
        assert_eq!(&bytes[30..32], &64u16.to_le_bytes());
        assert_eq!(&bytes[32..34], &[0, 0]);
        assert_eq!(&bytes[48..56], &[16; 8]);
        assert_eq!(&bytes[56..64], &[0; 8]);
    }

    /// The emulation against a direct reading of the SDM on small integers (exact in every type).
    #[test]
    fn emulated_products_follow_the_sdm() {
        let mut u = Emulated::default();
        // Small integers are bf16 values: their top 16 bits.
        let bf16 = |x: f32| (x.to_bits() >> 16) as u16;
        let a: Vec<u16> = (0..16 * 32).map(|i| bf16((i % 7) as f32 - 3.0)).collect();
        let b: Vec<u16> = (0..16 * 32).map(|i| bf16((i % 5) as f32 - 2.0)).collect();
        let c0: Vec<f32> = (0..256).map(|i| i as f32).collect();
        let mut c = vec![0f32; 256];
        // SAFETY: each buffer holds 16 rows of 64 bytes at the strides given.
        unsafe {
            u.load::<0>(c0.as_ptr() as *const u8, 64);
            u.load::<4>(a.as_ptr() as *const u8, 64);
            u.load::<6>(b.as_ptr() as *const u8, 64);
            u.dp_bf16::<0, 4, 6>();
            u.store::<0>(c.as_mut_ptr() as *mut u8, 64);
        }
        let v = |h: u16| f32::from_bits((h as u32) << 16);
        for m in 0..16 {
            for n in 0..16 {
                let want: f32 = c0[m * 16 + n] + (0..16).map(|k| (0..2).map(|h| v(a[m * 32 + 2 * k + h]) * v(b[k * 32 + 2 * n + h])).sum::<f32>()).sum::<f32>();
                assert_eq!(c[m * 16 + n], want, "({m}, {n})");
            }
        }
        let a: Vec<u8> = (0..1024).map(|i| (i * 37 % 256) as u8).collect();
        let b: Vec<i8> = (0..1024).map(|i| (i * 11 % 256) as u8 as i8).collect();
        let mut c = vec![0i32; 256];
        u.zero::<1>();
        // SAFETY: as above.
        unsafe {
            u.load::<5>(a.as_ptr(), 64);
            u.load::<7>(b.as_ptr() as *const u8, 64);
            u.dp_u8s8::<1, 5, 7>();
            u.store::<1>(c.as_mut_ptr() as *mut u8, 64);
        }
        for m in 0..16 {
            for n in 0..16 {
                let want: i32 = (0..16).map(|k| (0..4).map(|q| a[m * 64 + 4 * k + q] as i32 * b[k * 64 + 4 * n + q] as i32).sum::<i32>()).sum();
                assert_eq!(c[m * 16 + n], want, "({m}, {n})");
            }
        }
        // The signed operand first: the same bytes, their roles swapped.
        u.zero::<1>();
        // SAFETY: as above.
        unsafe {
            u.load::<5>(b.as_ptr() as *const u8, 64);
            u.load::<7>(a.as_ptr(), 64);
            u.dp_s8u8::<1, 5, 7>();
            u.store::<1>(c.as_mut_ptr() as *mut u8, 64);
        }
        for m in 0..16 {
            for n in 0..16 {
                let want: i32 = (0..16).map(|k| (0..4).map(|q| b[m * 64 + 4 * k + q] as i32 * a[k * 64 + 4 * n + q] as i32).sum::<i32>()).sum();
                assert_eq!(c[m * 16 + n], want, "({m}, {n})");
            }
        }
    }
}
