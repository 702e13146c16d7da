//! Hand-written CPU kernels for the layers where candle's generic CPU ops are slow (the
//! convolutional decoder at high resolution with few channels, the ViT's attention and
//! epilogues). Each is a candle `CustomOp`, so models stay device-generic: other devices take
//! candle's own ops. Which instruction set they use is chosen in [`crate::simd::isa`] only;
//! the kernels they share with each other (the f32 products, the elementwise maths) are in
//! [`crate::simd`].

pub mod attention;
pub mod bf16;
pub mod conv3x3;
pub mod int8;
pub mod linear;
pub mod planes;
pub mod winograd;

use crate::simd::{isa, sgemm};

/// The kernels are on unless `MOGE_GENERIC_OPS=1` asks for candle's generic ops (to measure
/// what each kernel gains, side by side in one run).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MOGE_GENERIC_OPS").map_or(true, |v| v != "1"))
}

/// The route the CPU kernels take for a model of `precision` built on this thread now: the
/// instruction set, why, and each kernel family's code path (what `moge info` and `moge bench`
/// print).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Route {
    /// The level in use ([`isa::current`]).
    pub isa: &'static str,
    /// What the CPU has ([`isa::detected`]).
    pub detected: &'static str,
    /// `MOGE_MAX_CPU_ISA` as given (null when unset).
    pub max_cpu_isa: Option<String>,
    /// Whether that value named no level and was ignored.
    pub max_cpu_isa_ignored: bool,
    pub precision: &'static str,
    /// Per family, the code path; null under `MOGE_GENERIC_OPS=1` (candle's generic ops).
    pub kernels: Option<Kernels>,
}

/// The code path of each kernel family. The f32 products go through the `gemm` crate, which
/// picks its own SIMD at run time (`MOGE_MAX_CPU_ISA` does not reach it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Kernels {
    /// 3x3 convolutions (the decoder): `direct <isa>` or `im2col`.
    pub conv3x3: String,
    /// Linear layers, 1x1 and transposed convolutions, im2col and attention products.
    pub products: String,
    pub attention: &'static str,
    /// Softmax's exp and GELU's erf: `avx512` or `portable`.
    pub softmax_gelu: &'static str,
}

/// The route for `precision` on this thread (see [`Route`]).
pub fn route(precision: super::Precision) -> Route {
    use isa::Isa;
    let level = isa::current();
    let bf16 = precision == super::Precision::Bf16;
    let (max_cpu_isa, max_cpu_isa_ignored) = match isa::cap() {
        isa::Cap::Unset => (None, false),
        isa::Cap::Level(l) => (Some(l.name().to_owned()), false),
        isa::Cap::Ignored(v) => (Some(v.clone()), true),
    };
    let kernels = enabled().then(|| Kernels {
        conv3x3: match conv3x3::route(level, bf16) {
            // The op's own test (`Conv3x3Op::new`): f32 on the AVX2 or AVX-512F direct route.
            Some(direct @ (Isa::Avx2 | Isa::Avx512)) if !bf16 => {
                let min = winograd::Winograd::min_channels(direct);
                format!("winograd f(2x2,3x3) {direct} ({min}+ channels; upsampled as 4 phases from {min}+), direct {direct} (fewer, fused upsample)")
            }
            Some(direct) => format!("direct {direct}"),
            None => "im2col".to_owned(),
        },
        products: match (bf16, bf16::route(level)) {
            _ if precision == super::Precision::Int8 => match int8::route(level) {
                int8::Route::Emulated => "int8 emulated (no VNNI on this route: quantised, through the f32 products) for the ViT's linears and the decoder's convolutions of 32+ channels (1x1: 64+), f32 for the rest".to_owned(),
                r => format!("int8 {} for the ViT's linears and the decoder's convolutions of 32+ channels (1x1: 64+), f32 for the rest", r.name()),
            },
            (false, _) => match sgemm::Micro::at(level) {
                Some(sgemm::Micro::Avx2) => "f32 own avx2 kernel (linears, attention, 1x1/transposed)".to_owned(),
                Some(sgemm::Micro::Avx512) => "f32 own avx512 kernel (linears, attention, 1x1/transposed)".to_owned(),
                None => "f32 gemm crate (its own SIMD choice)".to_owned(),
            },
            (true, Isa::Avx512Bf16) => "bf16 avx512bf16".to_owned(),
            (true, _) => "bf16 emulated (rounded inputs, f32 gemm crate)".to_owned(),
        },
        attention: "fused",
        softmax_gelu: crate::simd::route(level).name(),
    });
    Route { isa: level.name(), detected: isa::detected().name(), max_cpu_isa, max_cpu_isa_ignored, precision: precision.name(), kernels }
}

impl std::fmt::Display for Route {
    /// Two lines: the level and why, then the kernels.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cap = match (&self.max_cpu_isa, self.max_cpu_isa_ignored) {
            (None, _) => format!("{} unset", isa::ENV),
            (Some(v), false) => format!("{}={v}", isa::ENV),
            (Some(v), true) => format!("{}={v:?} ignored", isa::ENV),
        };
        writeln!(f, "cpu route: {} (detected {}; {cap}), precision {}", self.isa, self.detected, self.precision)?;
        match &self.kernels {
            Some(k) => write!(f, "cpu kernels: conv3x3 {}, products {}, attention {}, softmax/gelu {}", k.conv3x3, k.products, k.attention, k.softmax_gelu),
            None => write!(f, "cpu kernels: off (MOGE_GENERIC_OPS=1: candle's generic ops)"),
        }
    }
}

/// [`route`] as the two lines `moge info` and `moge bench` print.
pub fn route_description(precision: super::Precision) -> String {
    route(precision).to_string()
}

/// Runs `f` on the f32 data of a contiguous CPU tensor, without copying it: the kernels share
/// the model's weight tensors instead of keeping copies of their own.
pub fn with_f32<R>(t: &candle_core::Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => match layout.contiguous_offsets() {
            Some((a, b)) => Ok(f(&v[a..b])),
            None => candle_core::bail!("kernel weight is not contiguous"),
        },
        _ => candle_core::bail!("kernel weight is not an f32 CPU tensor"),
    }
}

/// The contiguous f32 data of a kernel input.
pub(crate) fn contiguous<'a>(s: &'a candle_core::CpuStorage, l: &candle_core::Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    let candle_core::CpuStorage::F32(v) = s else { candle_core::bail!("{what}: only f32 is supported") };
    let Some((a, b)) = l.contiguous_offsets() else { candle_core::bail!("{what}: input must be contiguous") };
    Ok(&v[a..b])
}
