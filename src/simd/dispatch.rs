//! [`dispatch!`]: one loop body compiled three times (the baseline target, AVX2, AVX-512F), the
//! build chosen on each call by a level from [`super::isa`].

use super::isa::Isa;

/// The code path of `dispatch!`'s functions at `level`: the AVX-512F build, the AVX2 one, or
/// the baseline. On aarch64 the baseline is NEON already, and the loops' extensions (dotprod,
/// i8mm, bf16) hold nothing they could use, so every level takes it.
pub fn route(level: Isa) -> Isa {
    match level {
        Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => Isa::Avx512,
        Isa::Avx2 => Isa::Avx2,
        Isa::Portable | Isa::Neon | Isa::Dotprod | Isa::I8mm | Isa::Bf16 => Isa::Portable,
    }
}

/// `fn $name(level, args)` that runs `$body` compiled for the [`route`] of `level` (lowered to
/// what the CPU has), and `fn $base(args)` that always runs it for the baseline target. The
/// code is the same, so every build gives the same bits (no contraction into FMA happens
/// without fast-math; an explicit `mul_add` is fused in every build, as one instruction where
/// the build has FMA, which the AVX2 level requires). The level is an argument, not read here,
/// because these run inside rayon tasks, where [`super::isa::with_isa`] does not reach. The one
/// dispatch of the model's elementwise loops and of the host's (resizes, post-processing,
/// output encoding).
macro_rules! dispatch {
    // A function without a result: the same, returning `()`.
    ($(#[$m:meta])* $vis:vis fn $name:ident / $base:ident($($a:ident: $t:ty),*) $body:block) => {
        $crate::simd::dispatch! { $(#[$m])* $vis fn $name / $base($($a: $t),*) -> () $body }
    };
    ($(#[$m:meta])* $vis:vis fn $name:ident / $base:ident($($a:ident: $t:ty),*) -> $r:ty $body:block) => {
        #[inline(always)]
        #[allow(dead_code)]
        $vis fn $base($($a: $t),*) -> $r $body

        $(#[$m])*
        $vis fn $name(level: $crate::simd::isa::Isa, $($a: $t),*) -> $r {
            #[cfg(target_arch = "x86_64")]
            {
                use $crate::simd::isa::{usable, Isa};
                #[target_feature(enable = "avx512f,fma")]
                fn wide($($a: $t),*) -> $r {
                    $base($($a),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn half($($a: $t),*) -> $r {
                    $base($($a),*)
                }
                match $crate::simd::route(usable(level)) {
                    // SAFETY: `usable` never exceeds what the CPU has, so at this route it has
                    // AVX-512F and FMA (every AVX-512 level implies the AVX2 level's FMA).
                    Isa::Avx512 => unsafe { wide($($a),*) },
                    // SAFETY: as above: at this route the CPU has AVX2 and FMA.
                    Isa::Avx2 => unsafe { half($($a),*) },
                    _ => $base($($a),*),
                }
            }
            // Elsewhere the baseline build only, for now.
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = level;
                $base($($a),*)
            }
        }
    };
}
pub(crate) use dispatch;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_follows_the_level() {
        let all = [Isa::Portable, Isa::Neon, Isa::Dotprod, Isa::I8mm, Isa::Bf16, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Amx];
        let want = [Isa::Portable, Isa::Portable, Isa::Portable, Isa::Portable, Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512, Isa::Avx512];
        assert_eq!(all.map(route), want);
    }
}
