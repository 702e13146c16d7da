//! The one place where the CPU kernels' instruction set is chosen.
//!
//! [`detected`] is what this CPU has, probed once. `MOGE_MAX_CPU_ISA` caps it for the whole
//! process (as oneDNN's `ONEDNN_MAX_CPU_ISA` does): it can switch routes off to compare them on
//! one machine, never switch on what the CPU lacks. [`current`] is the route a kernel takes.
//!
//! Kernels read [`current`] on the calling thread when they pack weights or build an op, keep
//! the `Isa` beside what they packed, and hand it down to their rayon tasks, which never ask
//! again: so a pack layout and the code that reads it always agree, and [`with_isa`] (a
//! per-thread override, for tests and A/B runs) covers everything built inside it.
//!
//! Each architecture has its own ladder above `Portable` (x86-64: AVX2, AVX-512F, AVX512-BF16,
//! AMX; aarch64: NEON, dotprod, i8mm, bf16), [`Isa::ALL`] lists this build's, and each level
//! implies the ones below it on its ladder, so a kernel may test `isa >= Isa::Avx2`. The aarch64
//! levels sit below AVX2 in the order, so such a test is false for them; a level of another
//! architecture is never detected, and [`usable`] lowers it to `Portable`.

use std::cell::Cell;
use std::sync::OnceLock;

/// The name of the environment variable that caps the instruction set.
pub const ENV: &str = "MOGE_MAX_CPU_ISA";

/// Instruction-set levels of the CPU kernels, in increasing order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// The baseline target of the build, no runtime-selected code (every architecture; on
    /// aarch64 that target has NEON already, which LLVM's vectorised loops use).
    Portable,
    /// aarch64 with the NEON kernels written for it (every aarch64 CPU has Advanced SIMD).
    Neon,
    /// aarch64 FEAT_DotProd (`sdot`/`udot`): Graviton 2+, Jetson Orin, Apple M1+.
    Dotprod,
    /// aarch64 FEAT_I8MM (`smmla`/`usmmla`) with dotprod: Graviton 3+, Apple M2+.
    I8mm,
    /// aarch64 FEAT_BF16 (`bfmmla`/`bfdot`) with i8mm: Graviton 3+, Apple M2+.
    Bf16,
    /// x86-64 AVX2 with FMA.
    Avx2,
    /// x86-64 AVX-512F (with AVX2 and FMA).
    Avx512,
    /// AVX-512 with BW, VL and BF16 (`vdpbf16ps`): native bf16 products.
    Avx512Bf16,
    /// Intel AMX (AMX-TILE and AMX-BF16, with the level below), where the kernel granted this
    /// process the tile state ([`crate::simd::amx::support`]): bf16 products on tiles.
    Amx,
}

impl Isa {
    /// Every level of this build's architecture, lowest first.
    #[cfg(target_arch = "x86_64")]
    pub const ALL: &'static [Isa] = &[Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Amx];
    /// Every level of this build's architecture, lowest first.
    #[cfg(target_arch = "aarch64")]
    pub const ALL: &'static [Isa] = &[Isa::Portable, Isa::Neon, Isa::Dotprod, Isa::I8mm, Isa::Bf16];
    /// Every level of this build's architecture, lowest first.
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub const ALL: &'static [Isa] = &[Isa::Portable];

    /// The name `MOGE_MAX_CPU_ISA` takes.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Neon => "neon",
            Isa::Dotprod => "dotprod",
            Isa::I8mm => "i8mm",
            Isa::Bf16 => "bf16",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Bf16 => "avx512bf16",
            Isa::Amx => "amx",
        }
    }

    /// A level from its name, in any case.
    pub fn from_name(s: &str) -> Option<Isa> {
        Isa::ALL.iter().copied().find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }

    /// The accepted names, best first, as the warning and the docs list them.
    pub fn names() -> String {
        Isa::ALL.iter().rev().map(|i| i.name()).collect::<Vec<_>>().join("|")
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The best level this CPU has (probed once).
pub fn detected() -> Isa {
    static DETECTED: OnceLock<Isa> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    use std::is_x86_feature_detected as has;
    // Each level requires the features of those below it, so that the order means "has".
    if !(has!("avx2") && has!("fma")) {
        return Isa::Portable;
    }
    if !has!("avx512f") {
        return Isa::Avx2;
    }
    if !(has!("avx512bw") && has!("avx512vl") && has!("avx512bf16")) {
        return Isa::Avx512;
    }
    match super::amx::support() {
        super::amx::Support::Usable { .. } => Isa::Amx,
        _ => Isa::Avx512Bf16,
    }
}

/// Why this CPU's AMX is not used though it has it (the kernel refused the tile state, say):
/// the one line the command line prints. `None` where there is no AMX or it is in use.
pub fn amx_refused() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    if let super::amx::Support::Refused(why) = super::amx::support() {
        return Some(why);
    }
    None
}

/// std's probe reads the kernel's hwcaps (`getauxval(AT_HWCAP/AT_HWCAP2)`) on Linux and
/// `sysctlbyname("hw.optional.arm.FEAT_*")` on macOS.
#[cfg(target_arch = "aarch64")]
fn detect() -> Isa {
    use std::arch::is_aarch64_feature_detected as has;
    // As on x86-64, a level counts only with everything below it.
    if !has!("neon") {
        return Isa::Portable;
    }
    if !has!("dotprod") {
        return Isa::Neon;
    }
    if !has!("i8mm") {
        return Isa::Dotprod;
    }
    if !has!("bf16") {
        return Isa::I8mm;
    }
    Isa::Bf16
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Isa {
    Isa::Portable
}

/// The int8 dot-product extensions this CPU has (`vpdpbusd`), probed once. They sit beside the
/// levels rather than being one: CPUs have them in every combination with BF16 (Ice Lake has
/// AVX512-VNNI without BF16, Alder Lake AVX-VNNI without AVX-512), so a route that uses them
/// asks for its level and for the extension (`crate::model::cpu::matmul::int8::route`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vnni {
    /// AVX512-VNNI, with the BW and VL the int8 kernels also use.
    pub avx512: bool,
    /// AVX-VNNI: the same products on 256-bit registers, VEX-encoded.
    pub avx: bool,
}

/// What [`Vnni`] this CPU has.
pub fn vnni() -> Vnni {
    static VNNI: OnceLock<Vnni> = OnceLock::new();
    *VNNI.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma");
            Vnni { avx512: avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni"), avx: avx2 && has!("avxvnni") }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Vnni { avx512: false, avx: false }
    })
}

/// Whether this CPU is Intel's (cpuid's vendor string `GenuineIntel`), probed once.
pub fn intel() -> bool {
    static INTEL: OnceLock<bool> = OnceLock::new();
    *INTEL.get_or_init(|| vendor() == *b"GenuineIntel")
}

/// cpuid's 12-byte vendor string (zeros off x86-64).
pub fn vendor() -> [u8; 12] {
    #[cfg(target_arch = "x86_64")]
    {
        // Leaf 0 exists on every x86-64 CPU.
        let r = std::arch::x86_64::__cpuid(0);
        let mut v = [0u8; 12];
        for (i, w) in [r.ebx, r.edx, r.ecx].into_iter().enumerate() {
            v[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    [0u8; 12]
}

/// What `MOGE_MAX_CPU_ISA` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cap {
    Unset,
    /// A level (which may be above what the CPU has: then it caps nothing).
    Level(Isa),
    /// A value that names no level: warned about once, and ignored.
    Ignored(String),
}

/// `MOGE_MAX_CPU_ISA`, read once. An unknown value is ignored; saying so is the caller's
/// (the command line warns of it once, see [`Cap::warning`]).
pub fn cap() -> &'static Cap {
    static CAP: OnceLock<Cap> = OnceLock::new();
    CAP.get_or_init(|| parse_cap(std::env::var_os(ENV).map(|v| v.to_string_lossy().into_owned()).as_deref()))
}

impl Cap {
    /// What is wrong with an ignored value, for a warning; `None` for the others.
    pub fn warning(&self) -> Option<String> {
        match self {
            Cap::Ignored(v) => Some(format!("{ENV}={v:?} is not one of {}; ignored", Isa::names())),
            _ => None,
        }
    }
}

fn parse_cap(v: Option<&str>) -> Cap {
    match v {
        None => Cap::Unset,
        Some(s) if s.trim().is_empty() => Cap::Unset,
        Some(s) => Isa::from_name(s).map_or_else(|| Cap::Ignored(s.to_owned()), Cap::Level),
    }
}

/// The best level this process may use: [`detected`], capped by `MOGE_MAX_CPU_ISA`.
pub fn max() -> Isa {
    static MAX: OnceLock<Isa> = OnceLock::new();
    *MAX.get_or_init(|| match cap() {
        Cap::Level(c) => detected().min(*c),
        _ => detected(),
    })
}

thread_local! {
    static OVERRIDE: Cell<Option<Isa>> = const { Cell::new(None) };
}

/// The level the kernels use on this thread: [`max`], or lower inside [`with_isa`].
pub fn current() -> Isa {
    OVERRIDE.with(Cell::get).unwrap_or_else(max)
}

/// `level` lowered to what this process may use: a kernel given a level from outside takes
/// this, so no value can reach code the CPU cannot run.
pub fn usable(level: Isa) -> Isa {
    if Isa::ALL.contains(&level) {
        level.min(max())
    } else {
        Isa::Portable
    }
}

/// Runs `f` with [`current`] returning `level` (lowered to [`max`]) on this thread: the ops
/// built and called inside take that route. Other threads, and rayon tasks that an op did not
/// start itself, are unaffected. Nests, and is undone if `f` panics.
pub fn with_isa<R>(level: Isa, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Isa>);
    impl Drop for Restore {
        fn drop(&mut self) {
            OVERRIDE.with(|o| o.set(self.0));
        }
    }
    let _restore = Restore(OVERRIDE.with(|o| o.replace(Some(usable(level)))));
    f()
}

/// Every level this process may use, lowest first: what the tests run each route at.
pub fn levels() -> impl Iterator<Item = Isa> {
    Isa::ALL.iter().copied().filter(|&i| i <= max())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_any_case() {
        for &isa in Isa::ALL {
            assert_eq!(Isa::from_name(isa.name()), Some(isa));
            assert_eq!(Isa::from_name(&isa.name().to_uppercase()), Some(isa));
        }
        assert_eq!(Isa::from_name("sse4"), None);
        // Only this architecture's levels have names to take.
        if cfg!(target_arch = "x86_64") {
            assert_eq!(Isa::from_name(" AVX2 "), Some(Isa::Avx2));
            assert_eq!(Isa::from_name("neon"), None);
            assert_eq!(Isa::names(), "amx|avx512bf16|avx512|avx2|portable");
        } else if cfg!(target_arch = "aarch64") {
            assert_eq!(Isa::from_name(" DotProd "), Some(Isa::Dotprod));
            assert_eq!(Isa::from_name("avx2"), None);
            assert_eq!(Isa::names(), "bf16|i8mm|dotprod|neon|portable");
        }
    }

    #[test]
    fn the_vendor_is_read() {
        let v = vendor();
        if cfg!(target_arch = "x86_64") {
            assert!(v.iter().all(|b| b.is_ascii_graphic() || *b == b' '), "{v:?}");
        }
        assert_eq!(intel(), &v == b"GenuineIntel");
    }

    #[test]
    fn the_cap_is_parsed_without_panicking() {
        assert_eq!(parse_cap(None), Cap::Unset);
        assert_eq!(parse_cap(Some("")), Cap::Unset);
        assert_eq!(parse_cap(Some("Portable")), Cap::Level(Isa::Portable));
        let (this, other) = if cfg!(target_arch = "aarch64") { (Isa::I8mm, "avx512") } else { (Isa::Avx512, "neon") };
        if Isa::ALL.contains(&this) {
            assert_eq!(parse_cap(Some(&this.name().to_uppercase())), Cap::Level(this));
        }
        assert_eq!(parse_cap(Some(other)), Cap::Ignored(other.into()));
        assert_eq!(parse_cap(Some("\u{fffd}x")), Cap::Ignored("\u{fffd}x".into()));
    }

    #[test]
    fn levels_are_ordered_and_capped() {
        assert!(Isa::Portable < Isa::Avx2 && Isa::Avx2 < Isa::Avx512 && Isa::Avx512 < Isa::Avx512Bf16 && Isa::Avx512Bf16 < Isa::Amx);
        assert!(Isa::Portable < Isa::Neon && Isa::Neon < Isa::Dotprod && Isa::Dotprod < Isa::I8mm && Isa::I8mm < Isa::Bf16);
        // x86-64's tests (`level >= Isa::Avx2`) are false for every aarch64 level.
        assert!(Isa::Bf16 < Isa::Avx2);
        assert!(Isa::ALL.windows(2).all(|w| w[0] < w[1]) && Isa::ALL[0] == Isa::Portable);
        // A level of another architecture is lowered to the baseline.
        let foreign = if cfg!(target_arch = "aarch64") { Isa::Avx2 } else { Isa::Neon };
        assert_eq!(usable(foreign), Isa::Portable);
        assert!(max() <= detected());
        let levels: Vec<Isa> = levels().collect();
        assert_eq!(levels.first(), Some(&Isa::Portable));
        assert_eq!(levels.last(), Some(&max()));
        assert_eq!(current(), max());
    }

    #[test]
    fn with_isa_overrides_this_thread_only_and_never_raises() {
        with_isa(Isa::Portable, || {
            assert_eq!(current(), Isa::Portable);
            // Other threads keep the process's level.
            assert_eq!(std::thread::spawn(current).join().unwrap(), max());
            with_isa(*Isa::ALL.last().unwrap(), || assert_eq!(current(), max()));
            assert_eq!(current(), Isa::Portable);
        });
        assert_eq!(current(), max());
        // Undone by a panic inside.
        let r = std::panic::catch_unwind(|| with_isa(Isa::Portable, || panic!("inside")));
        assert!(r.is_err());
        assert_eq!(current(), max());
    }
}
