//! Which CPU kernels run: whether they are on at all, and the route report of each kernel
//! family that `moge info` and `moge bench` print.

use crate::simd::{isa, sgemm};

use super::{conv3x3, matmul};

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
    /// Why this CPU's AMX is not used though it has it (null where it has none, or uses it).
    pub amx_refused: Option<&'static str>,
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
pub fn route(precision: crate::model::Precision) -> Route {
    use isa::Isa;
    let level = isa::current();
    let bf16 = precision == crate::model::Precision::Bf16;
    let (max_cpu_isa, max_cpu_isa_ignored) = match isa::cap() {
        isa::Cap::Unset => (None, false),
        isa::Cap::Level(l) => (Some(l.name().to_owned()), false),
        isa::Cap::Ignored(v) => (Some(v.clone()), true),
    };
    let kernels = enabled().then(|| Kernels {
        conv3x3: match conv3x3::route(level, bf16) {
            None if bf16 && level == Isa::Amx => "direct amx tiles (bf16 pairs of the padded map, converted once; upsampled as 4 phases; transposed 2x2 as 4 phases of one tap; 1x1 of 16-128 channels on one tap)".to_owned(),
            // int8 on AMX: the decoder's 3x3 convolutions in int8 from 64 input channels, the
            // rest in bf16 (`modules::int8_conv`, `modules::conv_bf16`).
            _ if precision == crate::model::Precision::Int8 && level == Isa::Amx => {
                "direct amx tiles: 3x3 in int8 from 64 input channels (quantised per band of rows; upsampled as 4 phases), in bf16 below and for the 1x1 and transposed 2x2 ones (32+ channels), winograd/direct avx512 f32 (fewer)".to_owned()
            }
            // The op's own test (`Conv3x3Op::new`): f32 on the AVX2, AVX-512F or NEON direct
            // route, the Winograd one where it pays.
            Some(direct @ (Isa::Avx2 | Isa::Avx512 | Isa::Neon)) if !bf16 => {
                let min = conv3x3::winograd::Winograd::min_channels(direct);
                format!("winograd f(2x2,3x3) {direct} ({min}+ channels; upsampled as 4 phases from {min}+), direct {direct} (fewer, fused upsample)")
            }
            Some(Isa::Bf16) => "direct bfmmla (bf16 channel quads of the padded map, converted once; fused upsample)".to_owned(),
            Some(direct) => format!("direct {direct}"),
            None => "im2col".to_owned(),
        },
        products: match (bf16, matmul::bf16::route(level)) {
            _ if precision == crate::model::Precision::Int8 => match matmul::int8::route(level) {
                matmul::int8::Route::Emulated => "int8 emulated (no VNNI on this route: quantised, through the f32 products) for the ViT's linears and the decoder's convolutions of 32+ channels (1x1: 64+), f32 for the rest".to_owned(),
                matmul::int8::Route::Amx => "int8 amx tiles for the ViT's linears (tdpbusd) and the decoder's 3x3 convolutions of 64+ input channels (tdpbsud), bf16 amx tiles for MoGe-3's sparse convolutions and the decoder's other convolutions of 32+ channels (1x1: 64+), f32 for the rest".to_owned(),
                r => format!("int8 {} for the ViT's linears, MoGe-3's sparse convolutions and the decoder's convolutions of 32+ channels (1x1: 64+), f32 for the rest", r.name()),
            },
            (false, _) => match sgemm::Micro::at(level) {
                Some(sgemm::Micro::Avx2) => "f32 own avx2 kernel (linears, attention, 1x1/transposed)".to_owned(),
                Some(sgemm::Micro::Avx512) => "f32 own avx512 kernel (linears, attention, 1x1/transposed)".to_owned(),
                Some(sgemm::Micro::Neon) => "f32 own neon kernel (linears, attention, 1x1/transposed)".to_owned(),
                None => "f32 gemm crate (its own SIMD choice)".to_owned(),
            },
            (true, Isa::Amx) => "bf16 amx tiles (tdpbf16ps)".to_owned(),
            (true, Isa::Avx512Bf16) => "bf16 avx512bf16".to_owned(),
            (true, Isa::Bf16) => "bf16 bfmmla (linears, attention, 1x1/transposed)".to_owned(),
            (true, _) => "bf16 emulated (rounded inputs, f32 gemm crate)".to_owned(),
        },
        // bf16 on AMX also under int8 (`dinov2::Block::load`).
        attention: if level == Isa::Amx && precision != crate::model::Precision::F32 { "fused, bf16 on amx tiles" } else { "fused" },
        softmax_gelu: crate::simd::route(level).name(),
    });
    Route {
        isa: level.name(),
        detected: isa::detected().name(),
        max_cpu_isa,
        max_cpu_isa_ignored,
        amx_refused: isa::amx_refused(),
        precision: precision.name(),
        kernels,
    }
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
pub fn route_description(precision: crate::model::Precision) -> String {
    route(precision).to_string()
}
