//! Elementwise maths of the encoder (softmax's exp, GELU's erf), written branch-free so LLVM
//! vectorises it, and compiled again for AVX2 and for AVX-512 by `super::dispatch!`: the
//! baseline x86-64 target only allows 4-lane SSE, and a released binary must still run on CPUs
//! without either. GELU is here, beside the kernels, because `super::sgemm` applies it to each
//! finished tile.

use super::dispatch;

/// e^x for x ≤ 0 (softmax after max subtraction): 2^n · p(r) with r = x − n·ln2, |r| ≤ ln2/2,
/// and a degree-6 polynomial (relative error < 2e-7). Written branch-free with float→int by the
/// 1.5·2²³ trick so that LLVM vectorises it.
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const MAGIC: f32 = 12_582_912.0; // 1.5·2²³
                                     // Plain multiply-adds: `mul_add` without a compile-time FMA target is a libm call.
    let x = x.max(-87.0);
    let t = x * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = r * (1.0 / 720.0) + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    // 2^n from the integer in t's low mantissa bits.
    let bits = (t.to_bits().wrapping_sub(MAGIC.to_bits()) as i32 + 127) << 23;
    p * f32::from_bits(bits as u32)
}

/// Exact GELU, x·Φ(x) with Φ(x) = erfc(−x/√2)/2, and erfc from the Chebyshev-fitted form
/// erfc(z) ≈ t·exp(−z² + P(t)), t = 1/(1 + z/2), z ≥ 0 (Numerical Recipes §6.2: fractional
/// error < 1.2e-7). Branch-free, so it vectorises, unlike libm's scalar erff (3 % of a ViT-S
/// forward).
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    let z = (x * std::f32::consts::FRAC_1_SQRT_2).abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = t * 0.170_872_77 - 0.822_152_23;
    let p = p * t + 1.488_515_9;
    let p = p * t - 1.135_204;
    let p = p * t + 0.278_868_07;
    let p = p * t - 0.186_288_06;
    let p = p * t + 0.096_784_18;
    let p = p * t + 0.374_091_96;
    let p = p * t + 1.000_023_7;
    let p = p * t - 1.265_512_2;
    // erfc(|z|): Φ(x) = erfc/2 for x < 0, 1 − erfc/2 otherwise.
    let e = t * exp_neg(p - z * z);
    let phi = if x < 0.0 { 0.5 * e } else { 1.0 - 0.5 * e };
    x * phi
}

/// SiLU, x·σ(x), with σ from [`exp_neg`] of −|x| (no overflow either side), branch-free.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    let e = exp_neg(-x.abs());
    let r = 1.0 / (1.0 + e);
    let s = if x >= 0.0 { r } else { e * r };
    x * s
}

dispatch! {
    /// SiLU in place.
    pub fn silu_in_place / silu_in_place_baseline(v: &mut [f32]) {
        v.iter_mut().for_each(|x| *x = silu(*x));
    }
}

dispatch! {
    /// GELU in place.
    pub fn gelu_in_place / gelu_in_place_baseline(v: &mut [f32]) {
        v.iter_mut().for_each(|x| *x = gelu(*x));
    }
}

dispatch! {
    /// In-place softmax of `scale · row`.
    pub fn softmax_row / softmax_row_baseline(row: &mut [f32], scale: f32) {
        // 16 independent lanes so the reductions vectorise.
        let mut m = [f32::NEG_INFINITY; 16];
        let mut chunks = row.chunks_exact(16);
        for c in &mut chunks {
            for i in 0..16 {
                m[i] = m[i].max(c[i]);
            }
        }
        let max = chunks.remainder().iter().copied().fold(m.iter().copied().fold(f32::NEG_INFINITY, f32::max), f32::max);
        let mut s = [0f32; 16];
        let mut chunks = row.chunks_exact_mut(16);
        for c in &mut chunks {
            for i in 0..16 {
                c[i] = exp_neg((c[i] - max) * scale);
                s[i] += c[i];
            }
        }
        let mut sum: f32 = s.iter().sum();
        for v in chunks.into_remainder() {
            *v = exp_neg((*v - max) * scale);
            sum += *v;
        }
        let inv = 1.0 / sum;
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

/// Σ f(x) in 16 independent lanes, then across them (an order that vectorises).
#[inline(always)]
fn lanes16(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut s = [0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for i in 0..16 {
            s[i] += f(c[i]);
        }
    }
    chunks.remainder().iter().fold(s.iter().sum::<f32>(), |a, &v| a + f(v))
}

dispatch! {
    /// LayerNorm of one row into `out`: (x − mean) / √(var + eps) · w + b, the mean and the
    /// variance in two passes of 16 independent lanes each (so they vectorise; a single running
    /// sum, as candle's, is one add per cycle), the variance as the mean of (x − mean)².
    pub fn layer_norm_row / layer_norm_row_baseline(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [std::mem::MaybeUninit<f32>]) {
        let d = x.len();
        assert!(w.len() == d && b.len() == d && out.len() == d, "layer_norm_row: widths");
        if d == 0 {
            return;
        }
        let mean = lanes16(x, |v| v) / d as f32;
        let var = lanes16(x, |v| (v - mean) * (v - mean)) / d as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(w).zip(b) {
            o.write((v - mean) * inv * w + b);
        }
    }
}

dispatch! {
    /// Softmax down each column of `s` (rows of `cols` floats, `cols` a multiple of 16) of
    /// `scale · s`, left unnormalised: `s` gets the exps and `sums` (cols) their column sums.
    pub fn softmax_columns / softmax_columns_baseline(s: &mut [f32], cols: usize, scale: f32, sums: &mut [f32]) {
        assert!(cols.is_multiple_of(16) && sums.len() == cols && s.len().is_multiple_of(cols), "softmax_columns: shapes");
        let mut c0 = 0;
        while c0 < cols {
            if c0 + 32 <= cols {
                columns_softmax::<32>(s, cols, c0, scale, &mut sums[c0..c0 + 32]);
                c0 += 32;
            } else {
                columns_softmax::<16>(s, cols, c0, scale, &mut sums[c0..c0 + 16]);
                c0 += 16;
            }
        }
    }
}

/// [`softmax_columns`] for columns c0..c0 + W, the running maxima and sums in registers (a
/// maximum kept in memory became masked stores, microcoded on AMD).
#[inline(always)]
fn columns_softmax<const W: usize>(s: &mut [f32], cols: usize, c0: usize, scale: f32, sums: &mut [f32]) {
    let mut m = [f32::NEG_INFINITY; W];
    for r in s.chunks_exact(cols) {
        let r: &[f32; W] = r[c0..c0 + W].try_into().expect("W floats");
        for i in 0..W {
            // A comparison rather than `f32::max`, whose NaN rule adds a compare and a blend.
            m[i] = if r[i] > m[i] { r[i] } else { m[i] };
        }
    }
    let mut z = [0f32; W];
    for r in s.chunks_exact_mut(cols) {
        let r: &mut [f32; W] = (&mut r[c0..c0 + W]).try_into().expect("W floats");
        for i in 0..W {
            r[i] = exp_neg((r[i] - m[i]) * scale);
            z[i] += r[i];
        }
    }
    sums.copy_from_slice(&z);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::isa;

    /// SiLU against f64 across the range the refiner sees, at every level.
    #[test]
    fn silu_matches_f64() {
        let xs: Vec<f32> = (-40_000..40_000).map(|i| i as f32 * 2.5e-3).chain([0.0, -0.0, 1e-30, -1e-30, 200.0, -200.0]).collect();
        for level in isa::levels() {
            let mut v = xs.clone();
            silu_in_place(level, &mut v);
            for (&x, &y) in xs.iter().zip(&v) {
                let want = x as f64 / (1.0 + (-(x as f64)).exp());
                let err = (y as f64 - want).abs();
                assert!(err <= 4e-7 * want.abs().max(1e-3), "silu({x}) = {y}, want {want} at {level:?}");
            }
        }
    }

    #[test]
    fn exp_neg_is_accurate_over_the_softmax_range() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let got = exp_neg(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_7;
        }
        assert!(worst < 3e-7, "worst relative error {worst:e}");
        assert_eq!(exp_neg(0.0), 1.0);
        assert!(exp_neg(-1000.0) < 1e-37);
    }

    #[test]
    fn gelu_matches_the_erf_definition() {
        let mut worst = 0f64;
        let mut x = -12.0f32;
        while x <= 12.0 {
            let xd = x as f64;
            let want = 0.5 * xd * (1.0 + libm::erf(xd / std::f64::consts::SQRT_2));
            let got = gelu(x) as f64;
            worst = worst.max((got - want).abs() / xd.abs().max(1e-30));
            x += 0.000_37;
        }
        assert!(worst < 5e-7, "worst error relative to |x|: {worst:e}");
        assert_eq!(gelu(0.0), 0.0);
        assert!(gelu(-30.0).abs() < 1e-36);
        assert_eq!(gelu(30.0), 30.0);
    }

    /// The tiles' vector GELU (`avx512::gelu16`) against the erf definition, relative to |x|,
    /// over the whole range: its tails past |x| = 6 are x and −0 exactly (not denormals).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vector_gelu_matches_the_erf_definition_and_its_tails() {
        if isa::max() < isa::Isa::Avx512 {
            eprintln!("gelu16: no AVX-512 here, skipped");
            return;
        }
        let xs: Vec<f32> = (-64_000..64_000).map(|i| i as f32 * 6.25e-4).chain([0.0, -0.0, 1e6, -1e6, 5.99, -5.99, 6.0, -6.0, f32::MAX, f32::MIN]).collect();
        let mut worst = 0f64;
        for c in xs.chunks(16) {
            let mut v = [0f32; 16];
            v[..c.len()].copy_from_slice(c);
            // SAFETY: the CPU has AVX-512F (checked above); 16 floats in and out.
            let got: [f32; 16] = unsafe {
                let y = crate::simd::avx512::gelu16(core::arch::x86_64::_mm512_loadu_ps(v.as_ptr()));
                core::mem::transmute::<core::arch::x86_64::__m512, [f32; 16]>(y)
            };
            for (&x, &g) in c.iter().zip(&got) {
                let xd = x as f64;
                let want = 0.5 * xd * (1.0 + libm::erf(xd / std::f64::consts::SQRT_2));
                worst = worst.max((g as f64 - want).abs() / xd.abs().max(1e-30));
                if x.abs() >= 6.0 {
                    assert_eq!(g.to_bits(), if x > 0.0 { x.to_bits() } else { (-0.0f32).to_bits() }, "gelu16({x}) = {g}");
                }
                assert!(g == 0.0 || g.is_normal(), "gelu16({x}) = {g}: a denormal");
            }
        }
        eprintln!("gelu16: worst error relative to |x| {worst:e}");
        assert!(worst < 4e-7, "worst error relative to |x|: {worst:e}");
    }

    #[test]
    fn softmax_rows_sum_to_one_and_match_the_definition() {
        let row: Vec<f32> = (0..100).map(|i| ((i * 37) % 23) as f32 * 0.7 - 5.0).collect();
        for scale in [1.0f32, 0.125] {
            let mut got = row.clone();
            softmax_row(isa::current(), &mut got, scale);
            let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
            let z: f64 = row.iter().map(|&v| ((v as f64 - max) * scale as f64).exp()).sum();
            for (g, v) in got.iter().zip(&row) {
                let want = ((*v as f64 - max) * scale as f64).exp() / z;
                assert!((*g as f64 - want).abs() < 1e-6 * want.max(1e-3), "{g} vs {want}");
            }
        }
    }

    /// Every level's build of each loop gives the baseline's bits.
    #[test]
    fn every_level_gives_the_baseline_bits() {
        let row: Vec<f32> = (0..1801).map(|i| ((i * 7919) % 1009) as f32 * 0.013 - 6.0).collect();
        let (mut s0, mut g0) = (row.clone(), row.clone());
        softmax_row_baseline(&mut s0, 0.125);
        gelu_in_place_baseline(&mut g0);
        for level in isa::levels() {
            let (mut s, mut g) = (row.clone(), row.clone());
            softmax_row(level, &mut s, 0.125);
            gelu_in_place(level, &mut g);
            assert_eq!(s, s0, "softmax at {level}");
            assert_eq!(g, g0, "gelu at {level}");
        }
    }

    /// Column softmax (48 columns: one 32-wide pass and one 16-wide) against the definition in
    /// f64, and every level's build against the baseline's bits.
    #[test]
    fn column_softmax_matches_the_definition_at_every_level() {
        let (rows, cols) = (37, 48);
        let s: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 1009) as f32 * 0.013 - 6.0).collect();
        let (mut base, mut base_sums) = (s.clone(), vec![0f32; cols]);
        softmax_columns_baseline(&mut base, cols, 0.125, &mut base_sums);
        for c in 0..cols {
            let col: Vec<f64> = (0..rows).map(|r| s[r * cols + c] as f64).collect();
            let max = col.iter().copied().fold(f64::MIN, f64::max);
            let e: Vec<f64> = col.iter().map(|v| ((v - max) * 0.125).exp()).collect();
            let z: f64 = e.iter().sum();
            assert!((base_sums[c] as f64 - z).abs() < 1e-6 * z, "column {c}: sum {} vs {z}", base_sums[c]);
            for (r, want) in e.iter().enumerate() {
                let got = base[r * cols + c] as f64;
                assert!((got - want).abs() < 1e-6 * want.max(1e-3), "[{r},{c}]: {got} vs {want}");
            }
        }
        for level in isa::levels() {
            let (mut got, mut sums) = (s.clone(), vec![0f32; cols]);
            softmax_columns(level, &mut got, cols, 0.125, &mut sums);
            assert_eq!((got, sums), (base.clone(), base_sums.clone()), "at {level}");
        }
    }
}
