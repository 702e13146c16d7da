//! The tests' random numbers: xorshift64* (Marsaglia's xorshift, Vigna's multiplier), seeded, so
//! every run draws the same values. It is for inputs whose exact values do not matter, only that
//! they are many, varied and the same on every run: a test that uses it must pass for any seed.
//!
//! core and std only: the library's unit tests (`test_rng` in `src/lib.rs`) and the benchmark
//! examples (`examples/common/mod.rs`) compile this file by path.
//!
//! Not drawn from here: the synthetic weights of `synth.rs`, a hash of each tensor's key and
//! element index that `tests/synth_weights.py` computes too and that the committed fixtures are
//! made of, bit for bit.

/// A xorshift64* generator; its state is never 0 (the one state xorshift does not leave).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose state starts at `seed` (0 is replaced by a fixed nonzero state).
    pub const fn new(seed: u64) -> Self {
        Rng(if seed == 0 { 0x9E37_79B9_7F4A_7C15 } else { seed })
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, n); 0 when n is 0.
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// Uniform in [-1, 1), in steps of 2^-23 (the top 24 bits of a draw).
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values of [`unit`](Self::unit).
    pub fn units(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }

    /// `n` bytes (the top byte of each draw).
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next_u64() >> 56) as u8).collect()
    }
}
