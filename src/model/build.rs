//! How a model is built: the device, the arithmetic and the kernels, decided once before any
//! layer is bound. Each layer reads them at load and keeps the one route they give it; no
//! layer asks the device or the environment again when it runs.

use candle_core::{DType, Device};

use super::Precision;
use crate::simd::isa::{self, Isa};

/// The ops a model's layers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ops {
    /// candle's generic ops: on another device, with bf16 product weights, or under
    /// `MOGE_GENERIC_OPS=1` (to measure what each kernel gains).
    Generic,
    /// The CPU kernels (`crate::model::cpu`) at this instruction-set level.
    Cpu(Isa),
}

/// What [`crate::Model::build`] builds: the device, the precision, the dtype of the products'
/// weights, and the [`Ops`], consistent with one another (made by [`BuildOptions::new`]).
#[derive(Debug, Clone)]
pub struct BuildOptions {
    device: Device,
    precision: Precision,
    dtype: DType,
    ops: Ops,
    /// Whether the decoder's last level is folded into smaller convolutions where it is linear
    /// (`crate::model::modules::FoldedTail`); `None`: in the fast precisions, not in f32
    /// ([`BuildOptions::with_fold`]).
    fold: Option<bool>,
}

impl BuildOptions {
    /// A model of `precision` on `device`: bf16 product weights for bf16 off the CPU (the CPU
    /// kernels keep f32 weights and round while packing), the CPU kernels on the CPU at this
    /// thread's level ([`isa::current`]) unless `MOGE_GENERIC_OPS=1`. Fails, saying why, where
    /// `precision` does not run there (int8 needs the CPU and its kernels).
    pub fn new(device: &Device, precision: Precision) -> Result<Self, String> {
        let dtype = if precision == Precision::Bf16 && !device.is_cpu() { DType::BF16 } else { DType::F32 };
        Self::make(device, precision, dtype)
    }

    /// The same with the products' weights in `dtype` (f32 or bf16): bf16 on the CPU runs
    /// candle's generic ops with the GPU's arithmetic (the tests' stand-in for it).
    pub fn with_dtype(self, dtype: DType) -> Result<Self, String> {
        Self::make(&self.device, self.precision, dtype).map(|o| Self { fold: self.fold, ..o })
    }

    fn make(device: &Device, precision: Precision, dtype: DType) -> Result<Self, String> {
        if !matches!(dtype, DType::F32 | DType::BF16) {
            return Err(format!("the matrix products run in f32 or bf16, not {dtype:?}"));
        }
        // The kernels take f32 weights on the host; `cpu::enabled` is asked here alone.
        let ops = if device.is_cpu() && dtype == DType::F32 && super::cpu::enabled() { Ops::Cpu(isa::current()) } else { Ops::Generic };
        match precision {
            Precision::Int8 if !device.is_cpu() => Err("--precision int8 runs on the CPU only: add --device cpu (a GPU runs bf16 or f32)".into()),
            Precision::Int8 if dtype != DType::F32 => Err("int8 products take f32 weights, not bf16".into()),
            Precision::Int8 if ops == Ops::Generic => Err("--precision int8 needs the CPU kernels: unset MOGE_GENERIC_OPS".into()),
            _ => Ok(Self { device: device.clone(), precision, dtype, ops, fold: None }),
        }
    }

    /// The same with the decoder's last level folded (`crate::model::modules::FoldedTail`:
    /// the same numbers up to rounding, less work) or computed as upstream writes it. By
    /// default bf16 and int8 fold it and f32 does not: f32 is the parity reference, and the
    /// order of its sums is upstream's (MoGe-3's refiner bins log-depth, so a rounding's
    /// difference can move a voxel).
    pub fn with_fold(self, fold: bool) -> Self {
        Self { fold: Some(fold), ..self }
    }

    /// Whether the decoder's last level is folded where it can be ([`BuildOptions::with_fold`]).
    pub fn folds(&self) -> bool {
        self.fold.unwrap_or(self.precision != Precision::F32)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The dtype of the matrix products' weights on the device. Activations are f32 between
    /// products either way.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn ops(&self) -> Ops {
        self.ops
    }

    /// The CPU kernels' level, where the layers run them.
    pub fn cpu_level(&self) -> Option<Isa> {
        match self.ops {
            Ops::Cpu(level) => Some(level),
            Ops::Generic => None,
        }
    }
}

impl Default for BuildOptions {
    /// f32 on the CPU.
    fn default() -> Self {
        Self::new(&Device::Cpu, Precision::F32).expect("f32 runs on the CPU")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_options_agree_with_one_another() {
        let cpu = |p| BuildOptions::new(&Device::Cpu, p).unwrap();
        assert_eq!(cpu(Precision::Bf16).dtype(), DType::F32, "the CPU kernels round while packing");
        let generic = cpu(Precision::Bf16).with_dtype(DType::BF16).unwrap();
        assert_eq!((generic.dtype(), generic.ops()), (DType::BF16, Ops::Generic));
        assert!(cpu(Precision::F32).with_dtype(DType::F16).unwrap_err().contains("f32 or bf16"));
        assert!(BuildOptions::new(&Device::Cpu, Precision::Int8).and_then(|o| o.with_dtype(DType::BF16)).unwrap_err().contains("int8"));
        assert_eq!(cpu(Precision::F32).ops() == Ops::Generic, !crate::model::cpu::enabled());
    }
}
