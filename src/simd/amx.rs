//! Intel AMX on stable Rust: whether this process may use the tiles, and the tile operations as
//! `asm!` (the AMX intrinsics are nightly-only; LLVM's assembler knows the instructions).
//!
//! Linux hands a process the tile data state only after it asks, with
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` (the kernel's
//! `Documentation/arch/x86/xstate.rst`); without it the first tile instruction faults. So
//! [`support`] asks once per process, and [`crate::simd::isa`] offers the `amx` level only where
//! the CPU has the instructions and the kernel granted the state.

use std::arch::asm;
use std::cell::Cell;
use std::sync::OnceLock;

use super::tiles::{Palette, TileUnit};

/// What this process may do with AMX.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Support {
    /// The CPU lacks AMX-TILE or AMX-BF16.
    Absent,
    /// The CPU has them and the kernel granted the tile state: the `amx` level is offered.
    Usable {
        /// AMX-INT8 too (`tdpbusd`).
        int8: bool,
    },
    /// The CPU has them, but the tiles cannot be used, and why (for the one line that says so).
    Refused(String),
}

/// [`Support`] of this process, probed (and the permission asked for) once.
pub fn support() -> &'static Support {
    static SUPPORT: OnceLock<Support> = OnceLock::new();
    SUPPORT.get_or_init(probe)
}

fn probe() -> Support {
    use std::is_x86_feature_detected as has;
    // cpuid leaf 7, subleaf 0, edx: bit 22 AMX-BF16, bit 24 AMX-TILE, bit 25 AMX-INT8.
    let edx = if has!("xsave") { std::arch::x86_64::__cpuid_count(7, 0).edx } else { 0 };
    let (bf16, tile, int8) = (edx >> 22 & 1 == 1, edx >> 24 & 1 == 1, edx >> 25 & 1 == 1);
    if !(bf16 && tile) {
        return Support::Absent;
    }
    // The OS must have enabled the tile state in XCR0 (bits 17 TILECFG and 18 TILEDATA).
    let osxsave = std::arch::x86_64::__cpuid(1).ecx >> 27 & 1 == 1;
    if !osxsave {
        return Support::Refused("the OS has not enabled XSAVE".into());
    }
    // SAFETY: OSXSAVE is set, so xgetbv with ecx = 0 is defined.
    let xcr0 = unsafe { xgetbv0() };
    if xcr0 >> 17 & 3 != 3 {
        return Support::Refused(format!("the OS has not enabled the tile state in XCR0 ({xcr0:#x})"));
    }
    match request_tile_data() {
        Ok(()) => Support::Usable { int8 },
        Err(why) => Support::Refused(why),
    }
}

/// XCR0.
///
/// # Safety
/// CPUID.1:ECX.OSXSAVE is set.
unsafe fn xgetbv0() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: the caller's promise makes xgetbv defined; it touches only eax, edx (and reads ecx).
    unsafe { asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags)) };
    (hi as u64) << 32 | lo as u64
}

#[cfg(target_os = "linux")]
fn request_tile_data() -> Result<(), String> {
    const ARCH_GET_XCOMP_PERM: libc::c_long = 0x1022;
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these codes reads only its integer argument (REQ) or writes one
    // u64 through the pointer given (GET).
    let r = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: {e})"));
    }
    let mut granted = 0u64;
    // SAFETY: as above; `granted` is a live u64.
    let r = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &mut granted as *mut u64) };
    if r != 0 || granted >> XFEATURE_XTILEDATA & 1 == 0 {
        return Err(format!("the kernel did not grant the AMX tile state (permitted features {granted:#x})"));
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> Result<(), String> {
    Err("the AMX route is written for Linux's arch_prctl permission only".into())
}

/// The palette every kernel uses ([`Palette::eight_full_tiles`]).
static PALETTE: Palette = Palette::eight_full_tiles();

thread_local! {
    /// Whether this thread has loaded [`PALETTE`]: the tile configuration is per thread, and
    /// nothing else in the process configures tiles, so once is enough.
    static CONFIGURED: Cell<bool> = const { Cell::new(false) };
}

/// The hardware tile unit of this thread, palette loaded. Exists only where [`support`] is
/// `Usable`, so every tile instruction below runs on a CPU and kernel that allow it.
pub struct Amx(());

impl Amx {
    /// The unit, or `None` where this process may not use the tiles.
    pub fn new() -> Option<Amx> {
        if !matches!(support(), Support::Usable { .. }) {
            return None;
        }
        if !CONFIGURED.with(Cell::get) {
            // SAFETY: the CPU has AMX-TILE and the kernel granted the state (`support`);
            // PALETTE is a valid 64-byte configuration (palette 1, eight 16 × 64-byte tiles).
            unsafe { asm!("ldtilecfg [{p}]", p = in(reg) &PALETTE as *const Palette, options(nostack, readonly, preserves_flags)) };
            CONFIGURED.with(|c| c.set(true));
        }
        Some(Amx(()))
    }
}

// An `Amx` exists only on a thread whose palette is loaded, in a process allowed the tiles
// (`Amx::new`): so every tile instruction below may run. Memory is touched only by `tileloadd`
// (reads) and `tilestored` (writes), at the rows the caller promised (the trait's contract).
impl TileUnit for Amx {
    // `Amx::new` exists only where `isa` reports the amx level, which implies AVX-512F.
    const AVX512: bool = true;
    #[inline(always)]
    unsafe fn load<const T: usize>(&mut self, ptr: *const u8, stride: usize) {
        // SAFETY: tiles usable here (above); the caller's 16 rows of 64 bytes are readable.
        unsafe { asm!("tileloadd tmm{t}, [{p} + {s}*1]", t = const T, p = in(reg) ptr, s = in(reg) stride, options(nostack, readonly, preserves_flags)) };
    }

    #[inline(always)]
    unsafe fn store<const T: usize>(&mut self, ptr: *mut u8, stride: usize) {
        // SAFETY: tiles usable here (above); the caller's 16 rows of 64 bytes are writable.
        unsafe { asm!("tilestored [{p} + {s}*1], tmm{t}", t = const T, p = in(reg) ptr, s = in(reg) stride, options(nostack, preserves_flags)) };
    }

    #[inline(always)]
    fn zero<const T: usize>(&mut self) {
        // SAFETY: tiles usable here (above); registers only.
        unsafe { asm!("tilezero tmm{t}", t = const T, options(nomem, nostack, preserves_flags)) };
    }

    #[inline(always)]
    fn dp_bf16<const C: usize, const A: usize, const B: usize>(&mut self) {
        // SAFETY: tiles usable here (above); registers only.
        unsafe { asm!("tdpbf16ps tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B, options(nomem, nostack, preserves_flags)) };
    }

    #[inline(always)]
    fn dp_u8s8<const C: usize, const A: usize, const B: usize>(&mut self) {
        // SAFETY: tiles usable here (above); registers only.
        unsafe { asm!("tdpbusd tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B, options(nomem, nostack, preserves_flags)) };
    }

    #[inline(always)]
    fn dp_s8u8<const C: usize, const A: usize, const B: usize>(&mut self) {
        // SAFETY: tiles usable here (above); registers only.
        unsafe { asm!("tdpbsud tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B, options(nomem, nostack, preserves_flags)) };
    }
}

#[cfg(test)]
mod tests {
    use super::super::tiles::Emulated;
    use super::*;

    /// Where the CPU has AMX, the hardware's products equal the emulation's on random data
    /// (bf16: within f32 rounding of the sum order; int8: exactly), tile by tile.
    #[test]
    fn the_hardware_matches_the_emulation() {
        let Some(mut hw) = Amx::new() else {
            eprintln!("skipped: no usable AMX on this machine ({:?})", support());
            return;
        };
        let mut em = Emulated::default();
        let mut rng = crate::test_rng::Rng::new(11);
        let bits = |x: f32| (x.to_bits() >> 16) as u16;
        let a: Vec<u16> = (0..512).map(|_| bits(rng.unit())).collect();
        let b: Vec<u16> = (0..512).map(|_| bits(rng.unit())).collect();
        let c0: Vec<f32> = (0..256).map(|_| rng.unit()).collect();
        let (mut got, mut want) = (vec![0f32; 256], vec![0f32; 256]);
        fn run<U: TileUnit>(u: &mut U, a: &[u16], b: &[u16], c0: &[f32], out: &mut [f32]) {
            // SAFETY: each buffer holds 16 rows of 64 bytes at stride 64.
            unsafe {
                u.load::<1>(c0.as_ptr() as *const u8, 64);
                u.load::<4>(a.as_ptr() as *const u8, 64);
                u.load::<7>(b.as_ptr() as *const u8, 64);
                u.dp_bf16::<1, 4, 7>();
                u.dp_bf16::<1, 4, 7>();
                u.store::<1>(out.as_mut_ptr() as *mut u8, 64);
            }
        }
        run(&mut hw, &a, &b, &c0, &mut got);
        run(&mut em, &a, &b, &c0, &mut want);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "bf16 element {i}: hardware {g}, emulated {w}");
        }
        if support() == &(Support::Usable { int8: true }) {
            let a: Vec<u8> = (0..1024).map(|_| (rng.unit() * 127.0 + 128.0) as u8).collect();
            let b: Vec<u8> = (0..1024).map(|_| (rng.unit() * 127.0) as i8 as u8).collect();
            fn run8<U: TileUnit>(u: &mut U, a: &[u8], b: &[u8], out: &mut [i32]) {
                u.zero::<2>();
                // SAFETY: as above.
                unsafe {
                    u.load::<5>(a.as_ptr(), 64);
                    u.load::<6>(b.as_ptr(), 64);
                    u.dp_u8s8::<2, 5, 6>();
                    u.store::<2>(out.as_mut_ptr() as *mut u8, 64);
                    // The signed operand first (the convolutions' order).
                    u.zero::<3>();
                    u.load::<4>(b.as_ptr(), 64);
                    u.load::<7>(a.as_ptr(), 64);
                    u.dp_s8u8::<3, 4, 7>();
                    u.store::<3>(out.as_mut_ptr().add(256) as *mut u8, 64);
                }
            }
            let (mut got, mut want) = (vec![0i32; 512], vec![0i32; 512]);
            run8(&mut hw, &a, &b, &mut got);
            run8(&mut em, &a, &b, &mut want);
            assert_eq!(got, want, "int8 tiles");
        }
    }
}
