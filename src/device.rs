//! Which device runs the network: `--device auto|cpu|cuda[:N]`.
//!
//! The CUDA device exists only in a binary built with the `cuda` feature (see
//! `scripts/build-cuda.sh`). Such a binary links no CUDA library: the driver, cuBLAS, cuRAND,
//! NVRTC and cuDNN are opened at run time, so it also starts on machines without them, where
//! `auto` takes the CPU and `cuda` is refused with one line naming what is missing. cudarc panics
//! when it cannot open a library, so every library is looked for before candle touches the
//! device, and the opening itself runs under `catch_unwind`.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    /// The GPU where this binary can use one, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// A CUDA GPU by ordinal (`cuda` = `cuda:0`).
    Cuda(usize),
}

impl FromStr for DeviceRequest {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("'{s}' is not a device: expected auto, cpu, cuda or cuda:N");
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda(0)),
            other => match other.strip_prefix("cuda:") {
                Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => n.parse().map(Self::Cuda).map_err(|_| bad()),
                _ => Err(bad()),
            },
        }
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Why the CUDA device cannot be used: each names what is missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("this moge was built without CUDA (build one with scripts/build-cuda.sh)")]
    NotCompiled,
    #[error("no NVIDIA driver: libcuda.so could not be loaded")]
    NoDriver,
    #[error("{0} could not be loaded (install the CUDA 13 libraries or add their folder to LD_LIBRARY_PATH)")]
    MissingLibrary(&'static str),
    #[error("no CUDA GPU: the driver reports none")]
    NoGpu,
    #[error("no CUDA GPU {ordinal}: the driver reports {count} (cuda:0 to cuda:{last})", last = count - 1)]
    NoSuchGpu { ordinal: usize, count: usize },
    #[error("the CUDA device could not be opened: {0}")]
    Failed(String),
}

/// An opened device, with what `bench`, `info` and the sidecar report about it.
#[derive(Debug, Clone)]
pub struct Opened {
    pub device: Device,
    /// `cpu` or `cuda:N`.
    pub name: String,
    /// The GPU's model name, where there is one.
    pub gpu: Option<String>,
    /// Why `auto` took the CPU (`None` when it was asked for or a GPU was taken).
    pub cpu_because: Option<Unavailable>,
}

impl Opened {
    fn cpu(cpu_because: Option<Unavailable>) -> Self {
        Self { device: Device::Cpu, name: "cpu".into(), gpu: None, cpu_because }
    }

    /// One line for people: `cpu`, `cpu (auto: no NVIDIA driver: ...)`, `cuda:0 (NVIDIA H200)`.
    /// A binary without CUDA has no choice to explain: plain `cpu`.
    pub fn describe(&self) -> String {
        match (&self.gpu, &self.cpu_because) {
            (Some(g), _) => format!("{} ({g})", self.name),
            (None, Some(why)) if *why != Unavailable::NotCompiled => format!("{} (auto: {why})", self.name),
            _ => self.name.clone(),
        }
    }
}

/// Opens the device `req` names. `Auto` never fails: without a usable GPU it is the CPU.
pub fn open(req: DeviceRequest) -> Result<Opened, Unavailable> {
    match req {
        DeviceRequest::Cpu => Ok(Opened::cpu(None)),
        DeviceRequest::Cuda(n) => open_cuda(n),
        DeviceRequest::Auto => Ok(open_cuda(0).unwrap_or_else(|why| Opened::cpu(Some(why)))),
    }
}

/// The arithmetic that suits `device` (`--precision auto`): bf16 products (f32 accumulation,
/// f32 between products) on a GPU and on a CPU whose route computes bf16 products natively (not
/// under `MOGE_MAX_CPU_ISA` below avx512bf16) and faster than f32
/// ([`crate::model::cpu::bf16::pays`]), else f32.
pub fn auto_precision(device: &Device) -> crate::model::Precision {
    if !device.is_cpu() || crate::model::cpu::bf16::pays() {
        crate::model::Precision::Bf16
    } else {
        crate::model::Precision::F32
    }
}

/// `cpu` or `cuda:N`, for a device already open.
pub fn name_of(device: &Device) -> String {
    match device {
        Device::Cpu => "cpu".into(),
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => format!("cuda:{}", d.cuda_stream().context().ordinal()),
        other => format!("{:?}", other.location()),
    }
}

/// Whether candle's conv2d can run on `device`: with the `cudnn` feature candle sends every
/// CUDA convolution to cuDNN, which is opened on first use and panics when absent, so the
/// model then builds its 3x3 convolutions from matrix products instead.
pub fn conv2d_usable(device: &Device) -> bool {
    if !device.is_cuda() {
        return true;
    }
    #[cfg(feature = "cudnn")]
    {
        static CUDNN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        // SAFETY: only tries to dlopen the library by its usual names.
        *CUDNN.get_or_init(|| unsafe { candle_core::cuda_backend::cudarc::cudnn::sys::is_culib_present() })
    }
    #[cfg(not(feature = "cudnn"))]
    true
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize) -> Result<Opened, Unavailable> {
    Err(Unavailable::NotCompiled)
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> Result<Opened, Unavailable> {
    use candle_core::cuda_backend::cudarc;
    // SAFETY: each only tries to dlopen a library by its usual names.
    let present = unsafe {
        [
            (cudarc::driver::sys::is_culib_present(), None),
            (cudarc::cublas::sys::is_culib_present(), Some("libcublas")),
            (cudarc::cublaslt::sys::is_culib_present(), Some("libcublasLt")),
            (cudarc::curand::sys::is_culib_present(), Some("libcurand")),
            (cudarc::nvrtc::sys::is_culib_present(), Some("libnvrtc")),
        ]
    };
    for (ok, lib) in present {
        if !ok {
            return Err(lib.map_or(Unavailable::NoDriver, Unavailable::MissingLibrary));
        }
    }
    let count = quiet_unwind(cudarc::driver::CudaContext::device_count).map_err(Unavailable::Failed)?.map_err(|e| match e.0 {
        // cuInit's answer on a machine whose driver sees no GPU.
        cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE => Unavailable::NoGpu,
        _ => Unavailable::Failed(format!("{e}")),
    })?;
    let count = usize::try_from(count).unwrap_or(0);
    if count == 0 {
        return Err(Unavailable::NoGpu);
    }
    if ordinal >= count {
        return Err(Unavailable::NoSuchGpu { ordinal, count });
    }
    // A stream of its own (not the per-thread default stream): the model is loaded on one thread
    // and run on the device worker's, and a CUDA graph is captured on it. Everything runs on
    // that one stream, so cudarc's cross-stream events (two per allocation, one per use) only
    // cost time, and a wait on one recorded outside a capture would break the capture.
    let device = quiet_unwind(|| Device::new_cuda_with_stream(ordinal)).map_err(Unavailable::Failed)?.map_err(|e| Unavailable::Failed(format!("{e}")))?;
    if let Device::Cuda(d) = &device {
        // SAFETY: no tensor exists yet on this device, and all its work goes to the one stream.
        unsafe { d.cuda_stream().context().disable_event_tracking() };
    }
    let gpu = match &device {
        Device::Cuda(d) => d.cuda_stream().context().name().ok(),
        _ => None,
    };
    Ok(Opened { device, name: format!("cuda:{ordinal}"), gpu, cpu_because: None })
}

/// Runs `f`, turning a panic into its message, without the panic hook's report on stderr
/// (cudarc's panics are the errors it has no other way to return).
#[cfg(feature = "cuda")]
fn quiet_unwind<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    r.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic in the CUDA libraries".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse() {
        assert_eq!("auto".parse(), Ok(DeviceRequest::Auto));
        assert_eq!("CPU".parse(), Ok(DeviceRequest::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceRequest::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceRequest::Cuda(3)));
        for bad in ["", "cuda:", "cuda:-1", "cuda:x", "metal", "cuda:1:2", "cuda: 1"] {
            assert!(bad.parse::<DeviceRequest>().is_err(), "{bad:?} parsed");
        }
        for r in [DeviceRequest::Auto, DeviceRequest::Cpu, DeviceRequest::Cuda(2)] {
            assert_eq!(r.to_string().parse(), Ok(r));
        }
    }

    #[test]
    fn cpu_always_opens_and_auto_falls_back() {
        let cpu = open(DeviceRequest::Cpu).unwrap();
        assert!(cpu.device.is_cpu());
        assert_eq!(cpu.describe(), "cpu");
        let auto = open(DeviceRequest::Auto).unwrap();
        if auto.device.is_cpu() {
            // Auto says why it did not take a GPU, and asking for one says the same.
            let why = auto.cpu_because.clone().expect("auto on the CPU names the reason");
            assert_eq!(open(DeviceRequest::Cuda(0)).unwrap_err(), why);
            if why == Unavailable::NotCompiled {
                assert_eq!(auto.describe(), "cpu");
            } else {
                assert!(auto.describe().starts_with("cpu (auto: "), "{}", auto.describe());
            }
        } else {
            assert_eq!(auto.name, "cuda:0");
        }
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_names_the_build() {
        let e = open(DeviceRequest::Cuda(0)).unwrap_err();
        assert_eq!(e, Unavailable::NotCompiled);
        assert!(e.to_string().contains("built without CUDA"));
    }

    #[test]
    fn no_such_gpu_names_the_range() {
        let e = Unavailable::NoSuchGpu { ordinal: 4, count: 2 };
        assert_eq!(e.to_string(), "no CUDA GPU 4: the driver reports 2 (cuda:0 to cuda:1)");
    }
}
