//! The `moge` command line. Exit status: 0 all done, 1 some inputs failed, 2 usage or fatal
//! error (weights that do not load, an output that cannot be written), 130 interrupted.

pub mod assets;
pub mod batch;
mod bench;
pub mod colmap;
mod compare;
mod download;
mod info;
mod panorama;
mod predict;
mod quantize;
mod report;
mod serve;
mod values;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use values::{CompressionArg, FormatArg, NormalDtypeArg};

pub const EXIT_OK: i32 = 0;
pub const EXIT_SOME_FAILED: i32 = 1;
pub const EXIT_FATAL: i32 = 2;
pub const EXIT_INTERRUPTED: i32 = 130;

#[derive(Parser, Debug)]
#[command(name = "moge", version, about = "Metric 3D geometry from photos with MoGe-2", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Predict geometry for image files.
    Predict(predict::PredictArgs),
    /// Predict geometry for every photo under directories, streaming, outputs in a mirrored tree.
    Batch(batch::BatchArgs),
    /// 360° equirectangular panoramas: twelve views through the model, merged into one metric distance map.
    Panorama(panorama::PanoramaArgs),
    /// Depth for every image of a COLMAP reconstruction, with its camera, at the reconstruction's scale (depth priors for Gaussian splatting and NeRF).
    Colmap(colmap::ColmapArgs),
    /// Keep the model loaded and answer HTTP requests with the API of the Tenstorrent MoGe-2 server (tt-MoGe).
    Serve(serve::ServeArgs),
    /// Time the model: cold start, warm per-image time, stages, peak memory.
    Bench(bench::BenchArgs),
    /// How far the predictions in B are from those in A (npz files or output directories): PCC, depth error, mask IoU, fov, scale.
    Compare(compare::CompareArgs),
    /// Store a checkpoint's weights in int8 (a scale per channel), a quarter of the size, for --precision int8.
    Quantize(quantize::QuantizeArgs),
    /// Fetch published models into the Hugging Face cache ahead of time.
    Download(download::DownloadArgs),
    /// List the published models: which are cached, where, their size and sha256.
    #[command(visible_alias = "models")]
    Info(info::InfoArgs),
    /// Write the man pages and shell completions (for packagers).
    #[command(hide = true)]
    GenerateAssets(assets::AssetsArgs),
}

/// What to write per image (`predict` and `batch`).
#[derive(Args, Debug, Clone)]
pub struct OutputArgs {
    /// Output formats, a comma list.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "npz")]
    pub format: Vec<FormatArg>,
    /// Metres per unit of the 16-bit depth PNG (0 = invalid; values beyond 65535 saturate).
    #[arg(long, value_name = "M", default_value_t = 0.001, value_parser = parse_positive)]
    pub depth_scale: f32,
    /// Relative depth jump over a 3x3 neighbourhood that removes a pixel from ply / glb ('inf'
    /// keeps all); default 0.04 for a photo, 0.03 for a panorama (upstream's defaults; a
    /// panorama's pixel goes only where its surface also turns).
    #[arg(long, value_name = "R", value_parser = parse_positive)]
    pub edge_rtol: Option<f32>,
    /// How npz arrays are stored: none (np.savez, the fastest), fast (deflate level 1: smaller,
    /// several times slower to write), small (deflate level 9).
    #[arg(long, value_enum, value_name = "HOW", default_value_t = moge::outputs::npz::Compression::default().into())]
    pub npz_compression: CompressionArg,
    /// Element type of the npz normal: float32, or float16 as the Tenstorrent MoGe-2 server (tt-MoGe) sends it.
    #[arg(long, value_enum, value_name = "TYPE", default_value_t = moge::outputs::npz::NormalDtype::default().into())]
    pub npz_normal_dtype: NormalDtypeArg,
    /// Same as --npz-compression none.
    #[arg(long, hide = true, conflicts_with = "npz_compression")]
    pub no_compress: bool,
}

fn parse_positive(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if v > 0.0 {
        Ok(v)
    } else {
        Err(format!("{v} is not positive"))
    }
}

impl OutputArgs {
    pub fn options(&self) -> moge::outputs::OutputOptions {
        moge::outputs::OutputOptions {
            formats: self.format.iter().map(|&f| f.into()).collect(),
            depth_png_scale: self.depth_scale,
            edge_rtol: self.edge_rtol.unwrap_or(moge::outputs::OutputOptions::default().edge_rtol),
            npz_compression: if self.no_compress { moge::outputs::npz::Compression::None } else { self.npz_compression.into() },
            npz_normal: self.npz_normal_dtype.into(),
        }
    }
}

/// How photos are read (`predict` and `batch`).
#[derive(Args, Debug, Clone)]
pub struct InputArgs {
    /// Keep the raw pixel order of JPEG/TIFF/WebP files (do not apply the EXIF orientation).
    #[arg(long)]
    pub no_exif: bool,
    /// Refuse images larger than this, from their header, before decoding (a small damaged or
    /// hostile file can claim any size).
    #[arg(long, value_name = "MP", default_value_t = moge::image_io::MAX_PIXELS as f32 / 1e6, value_parser = parse_positive)]
    pub max_megapixels: f32,
    /// Process truncated JPEG/PNG/WebP files anyway (the missing part is filled in by the
    /// decoder), with a warning for each, instead of failing them.
    #[arg(long)]
    pub allow_truncated: bool,
}

impl Default for InputArgs {
    /// The command line's defaults.
    fn default() -> Self {
        Self { no_exif: false, max_megapixels: moge::image_io::MAX_PIXELS as f32 / 1e6, allow_truncated: false }
    }
}

impl InputArgs {
    pub fn options(&self) -> moge::image_io::DecodeOptions {
        moge::image_io::DecodeOptions {
            apply_exif: !self.no_exif,
            max_pixels: (self.max_megapixels as f64 * 1e6).round() as u64,
            allow_truncated: self.allow_truncated,
            fov: Default::default(),
        }
    }
}

/// A running server as the device (`predict` and `batch`).
#[derive(Args, Debug, Clone)]
pub struct RemoteArgs {
    /// Send the photos to a running server (`moge serve`, or the Tenstorrent MoGe-2 server
    /// (tt-MoGe)) instead of loading a model here; photos are decoded and outputs written here.
    /// Given more than once (or as a comma list): a pool, each photo going to the least loaded
    /// server that is up; a server that fails is taken out, its photos sent to the others, and
    /// taken back when it answers `/health` again.
    #[arg(long, value_name = "URL", value_delimiter = ',', conflicts_with_all = ["weights", "precision", "device"])]
    pub server: Vec<String>,
    /// Requests in flight at once to each server (so that its device never waits).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256), requires = "server")]
    pub in_flight: u32,
    /// Seconds one request to the server may take before it is retried (in a pool: sent to
    /// another server).
    #[arg(long, value_name = "S", default_value_t = 120, value_parser = clap::value_parser!(u32).range(1..=86_400), requires = "server")]
    pub server_timeout: u32,
    /// Retries of a request that failed for the network's or the server's sake (no connection,
    /// a timeout, 5xx, 503 busy); a refused photo (4xx) is not retried. In a pool, a photo that got
    /// no answer goes to another server at once, one that got 5xx once the retries are spent.
    #[arg(long, value_name = "N", default_value_t = 3, requires = "server")]
    pub server_retries: u32,
}

impl RemoteArgs {
    /// The engine: the server(s), checked to answer, or the model loaded here.
    pub fn engine(&self, model: &ModelArgs, infer: &InferArgs) -> anyhow::Result<(PathBuf, moge::pipeline::run::Engine)> {
        use moge::pipeline::run::Engine;
        use std::sync::Arc;
        if infer.per_step && !self.server.is_empty() {
            anyhow::bail!("--per-step keeps the refine steps of a model run here: a server answers with the final maps only");
        }
        let opts = moge::remote::ClientOptions {
            timeout: std::time::Duration::from_secs(self.server_timeout as u64),
            retries: self.server_retries,
            in_flight: self.in_flight as usize,
            ..Default::default()
        };
        match self.server.as_slice() {
            [] => {
                let (weights, m) = model.load()?;
                Ok((weights, Engine::Local(Arc::new(m))))
            }
            [url] => Ok((PathBuf::new(), Engine::Remote(Arc::new(moge::remote::Client::connect(url, opts)?)))),
            urls => Ok((PathBuf::new(), Engine::Pool(Arc::new(moge::remote::pool::Pool::connect_noting(urls, opts, Arc::new(report::print_notice))?)))),
        }
    }
}

/// Where the weights come from: a file, or a published model.
#[derive(Args, Debug, Clone)]
pub struct WeightsArgs {
    /// A local checkpoint: upstream model.pt, or .safetensors with its JSON config beside it.
    #[arg(long, value_name = "PATH", conflicts_with = "model")]
    pub weights: Option<PathBuf>,
    /// A published model, fetched from the Hugging Face hub on first use.
    #[arg(long, value_name = "NAME", default_value = moge::hub::DEFAULT_MODEL, value_parser = model_names())]
    pub model: String,
    /// Branch, tag or commit of the published model's repo.
    #[arg(long, value_name = "REV", default_value = moge::hub::DEFAULT_REVISION, conflicts_with = "weights")]
    pub revision: String,
}

impl WeightsArgs {
    /// The checkpoint path: `--weights`, or the hub model (cached or downloaded).
    pub fn checkpoint(&self) -> anyhow::Result<PathBuf> {
        match &self.weights {
            Some(p) => Ok(p.clone()),
            None => moge::hub::resolve_revision(&self.model, &self.revision),
        }
    }

    /// The model's name in sidecars: the published name, or the checkpoint's file name.
    pub fn id(&self) -> String {
        match &self.weights {
            Some(p) => p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| p.display().to_string()),
            None => self.model.clone(),
        }
    }
}

/// The model to run: its weights, arithmetic and device.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    #[command(flatten)]
    pub source: WeightsArgs,
    /// Arithmetic of the network. auto: bf16 on a CUDA GPU, on an Intel CPU with AMX tiles, and
    /// on a CPU whose AVX512-BF16 beats f32 (AMD Zen 4 and later; every output keeps PCC >= 0.9999
    /// against upstream fp32), else f32;
    /// f32 for number-for-number parity; int8 (never auto) for int8 products.
    #[arg(long, value_enum, default_value_t = Precision::Auto)]
    pub precision: Precision,
    /// Where the network runs: auto (a CUDA GPU where this moge has CUDA and the driver sees
    /// one, else the CPU), cpu, cuda or cuda:N.
    #[arg(long, value_name = "DEVICE", default_value = "auto", value_parser = parse_device)]
    pub device: moge::device::DeviceRequest,
}

fn parse_device(s: &str) -> Result<moge::device::DeviceRequest, String> {
    s.parse()
}

fn model_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(moge::hub::MODELS.iter().map(|(n, _)| *n))
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// bf16 where the CPU runs bf16 products faster than f32 (AMX tiles; AVX512-BF16 on AMD Zen 4 and later), else f32.
    Auto,
    /// Exact float32, the parity reference.
    F32,
    /// bf16 products with f32 accumulation (AMD AVX512-BF16 CPUs: several times faster; on Intel's, slower than f32).
    Bf16,
    /// The ViT's linears, the decoder's convolutions and MoGe-3's refiner convolutions as int8 products (weights per channel, activations per token, pixel or voxel), the rest f32; CPU only, fast with AVX512-VNNI (Intel Xeon since Cascade Lake, AMD Zen 4 and later) or AVX-VNNI (Intel Core since Alder Lake). Never chosen by auto: check what it costs on your photos with `moge compare`.
    Int8,
}

impl Precision {
    /// The arithmetic on `device` (auto: [`moge::model::Precision::auto`]).
    pub fn resolve(self, device: &moge::Device) -> moge::model::Precision {
        match self {
            Precision::Auto => moge::model::Precision::auto(device),
            Precision::F32 => moge::model::Precision::F32,
            Precision::Bf16 => moge::model::Precision::Bf16,
            Precision::Int8 => moge::model::Precision::Int8,
        }
    }
}

/// The options of upstream `infer()`.
#[derive(Args, Debug, Clone)]
pub struct InferArgs {
    /// Base ViT tokens (more: finer and slower). Upstream suggests 1200..2500.
    #[arg(long, value_name = "N", default_value_t = moge::infer::DEFAULT_NUM_TOKENS, value_parser = parse_num_tokens)]
    pub num_tokens: u32,
    /// Upstream's resolution level 0..9 (1200..3600 tokens); replaces --num-tokens.
    #[arg(long, value_name = "L", value_parser = parse_resolution_level)]
    pub resolution_level: Option<u32>,
    /// Known horizontal field of view in degrees (otherwise it is recovered); `exif`: each
    /// photo's from its EXIF focal length (FocalLengthIn35mmFilm, or FocalLength with
    /// FocalPlaneXResolution), recovered where the photo has none (the sidecar's
    /// `inference.fov_x_source` says which).
    #[arg(long, value_name = "DEG|exif", value_parser = parse_fov)]
    pub fov_x: Option<Fov>,
    /// The camera matrix in pixels, where it is known (the image's top-left corner at 0,0, as
    /// COLMAP has it; OpenCV's cx, cy are 0.5 less). Used whole: where fx != fy or the principal
    /// point is off the centre, the photo is resampled to square pixels and placed with the
    /// principal point at the centre of a larger view, and the outputs mapped back to the
    /// photo's pixels and this camera.
    #[arg(long, value_name = "FX,FY,CX,CY", value_parser = parse_intrinsics, conflicts_with = "fov_x")]
    pub intrinsics: Option<moge::camera::Pinhole>,
    /// Each photo's own camera matrix, used whole as --intrinsics is: a CSV of name,fx,fy,cx,cy
    /// (with or without a header), or a JSON of name: [fx, fy, cx, cy], or nerfstudio's
    /// transforms.json. A name is the photo's path or its end (`x.jpg`, `sub/x.jpg`); a photo
    /// without a row fails, the rest run.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["fov_x", "intrinsics"])]
    pub intrinsics_from: Option<PathBuf>,
    /// Keep invalid pixels (no inf / zero normals outside the mask).
    #[arg(long)]
    pub no_mask: bool,
    /// Keep the predicted x, y instead of re-projecting the depth through the intrinsics.
    #[arg(long)]
    pub no_force_projection: bool,
    /// MoGe-3's refinement passes over the depth (default 3; 0 gives the MoGe-2 output of the
    /// same network, about 1.5x faster). MoGe-2 models have none.
    #[arg(long, value_name = "N", value_parser = parse_refine_steps)]
    pub refine_steps: Option<u32>,
    /// MoGe-3: also keep each refine step's maps, in the npz as upstream's `points_per_step`,
    /// `depth_per_step`, `intrinsics_per_step` (and `mask_per_step`), step 0 unrefined.
    #[arg(long)]
    pub per_step: bool,
}

/// `--fov-x`: degrees, or each photo's own from its EXIF.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fov {
    Degrees(f32),
    Exif,
}

fn parse_fov(s: &str) -> Result<Fov, String> {
    if s.eq_ignore_ascii_case("exif") {
        return Ok(Fov::Exif);
    }
    let v: f32 = s.parse().map_err(|_| format!("'{s}' is not a number of degrees or `exif`"))?;
    moge::infer::check_fov_x(v).map(Fov::Degrees)
}

fn parse_intrinsics(s: &str) -> Result<moge::camera::Pinhole, String> {
    let v: Vec<f64> = s.split(',').map(|p| p.trim().parse::<f64>()).collect::<Result<_, _>>().map_err(|_| format!("'{s}' is not four numbers FX,FY,CX,CY"))?;
    let [fx, fy, cx, cy] = v[..] else { return Err(format!("'{s}' is not four numbers FX,FY,CX,CY")) };
    moge::camera::Pinhole::new([fx, fy, cx, cy]).map_err(|why| format!("'{s}': {why}"))
}

/// A whole number within `bounds`, in clap's words for a number out of its range.
fn parse_within(s: &str, bounds: moge::infer::Bounds) -> Result<u32, String> {
    let v: u64 = s.parse().map_err(|e: std::num::ParseIntError| e.to_string())?;
    bounds.check(v)
}

pub(crate) fn parse_num_tokens(s: &str) -> Result<u32, String> {
    parse_within(s, moge::infer::NUM_TOKENS)
}

fn parse_resolution_level(s: &str) -> Result<u32, String> {
    parse_within(s, moge::infer::RESOLUTION_LEVELS)
}

fn parse_refine_steps(s: &str) -> Result<u32, String> {
    parse_within(s, moge::infer::REFINE_STEPS)
}

impl InferArgs {
    /// Gives each input its camera from `--intrinsics-from`; an input without one is marked
    /// with the reason (it fails, the rest run).
    pub fn attach_cameras(&self, inputs: &mut [moge::Input]) -> anyhow::Result<()> {
        let Some(file) = &self.intrinsics_from else { return Ok(()) };
        let table = moge::camera::table::Table::read(file)?;
        for input in inputs.iter_mut().filter(|i| i.problem.is_none()) {
            match table.lookup(&input.path) {
                Some(k) => input.camera = Some(k),
                None => input.problem = Some(format!("no camera for it in {}", file.display())),
            }
        }
        Ok(())
    }

    /// Where each photo's field of view is known from.
    pub fn fov_from(&self) -> moge::image_io::FovFrom {
        use moge::image_io::FovFrom;
        match (self.fov_x, self.intrinsics) {
            (Some(Fov::Exif), _) => FovFrom::Exif,
            (_, Some(k)) => FovFrom::Intrinsics(k),
            _ => FovFrom::Estimate,
        }
    }

    pub fn options(&self) -> moge::InferOptions {
        moge::InferOptions {
            num_tokens: if self.resolution_level.is_some() { None } else { Some(self.num_tokens) },
            resolution_level: self.resolution_level.unwrap_or(9),
            fov_x: match self.fov_x {
                Some(Fov::Degrees(d)) => Some(d),
                _ => None,
            },
            force_projection: !self.no_force_projection,
            apply_mask: !self.no_mask,
            point_map: true,
            normal_map: true,
            refine_steps: self.refine_steps,
            per_step: self.per_step,
        }
    }
}

impl ModelArgs {
    /// The checkpoint path ([`WeightsArgs::checkpoint`]).
    pub fn checkpoint(&self) -> anyhow::Result<PathBuf> {
        self.source.checkpoint()
    }

    /// The model's name in sidecars ([`WeightsArgs::id`]).
    pub fn id(&self) -> String {
        self.source.id()
    }

    /// The checkpoint and the model loaded from it on `--device` at the resolved precision:
    /// every command that runs the model loads it here, so the same options give the same
    /// numbers everywhere. The device is opened first, so a missing GPU is said before a download.
    pub fn load(&self) -> anyhow::Result<(PathBuf, moge::Model)> {
        let device = self.open_device()?;
        let path = self.checkpoint()?;
        let model = self.load_on(&path, &device.device)?;
        Ok((path, model))
    }

    /// `--device`, opened; an impossible request is one line naming what is missing.
    /// The device, opened, and checked to run `--precision` (before any download).
    pub fn open_device(&self) -> anyhow::Result<moge::device::Opened> {
        let opened = moge::device::open(self.device).map_err(|e| anyhow::anyhow!("--device {}: {e}", self.device))?;
        moge::model::BuildOptions::new(&opened.device, self.precision.resolve(&opened.device)).map_err(|e| anyhow::anyhow!("--device {}: {e}", self.device))?;
        Ok(opened)
    }

    /// [`ModelArgs::load`] of a checkpoint already resolved on a device already open (`bench`
    /// times this part alone).
    pub fn load_on(&self, path: &std::path::Path, device: &moge::Device) -> anyhow::Result<moge::Model> {
        let build = moge::model::BuildOptions::new(device, self.precision.resolve(device)).map_err(anyhow::Error::msg)?;
        moge::Model::load(path, &build)
    }
}

/// The pipeline's settings from the options `predict` and `batch` share; each command then sets
/// what is its own (threads, progress, fit).
pub fn pipeline_config(
    output: &std::path::Path,
    model: &ModelArgs,
    weights: PathBuf,
    infer: &InferArgs,
    outputs: moge::outputs::OutputOptions,
    input: &InputArgs,
) -> moge::pipeline::run::Config {
    moge::pipeline::run::Config {
        outputs,
        plan: moge::Plan { infer: infer.options(), fov: infer.fov_from(), ..moge::Plan::default() },
        decode: input.options(),
        jobs: 1,
        model_id: model.id(),
        weights,
        in_flight: 1,
        ..moge::pipeline::run::Config::new(output)
    }
}

/// Runs the command line; returns the exit status.
pub fn main() -> i32 {
    main_from(std::env::args_os())
}

/// [`main`] on these arguments (the first is the program's name): the entry point of the
/// `moge` that the Python wheel installs, whose process's own arguments are Python's.
pub fn main_from(args: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    moge::memory::keep_freed_memory();
    let cli = Cli::parse_from(args);
    // Said here, once, rather than by the library wherever the kernels first read it.
    if let Some(w) = moge::simd::isa::cap().warning() {
        moge::errln!("moge: warning: {w}");
    }
    // A CPU with AMX whose kernel refused the tile state runs the AVX-512 route: say why once
    // (unless MOGE_MAX_CPU_ISA asked for less anyway).
    if let (Some(why), false) =
        (moge::simd::isa::amx_refused(), matches!(moge::simd::isa::cap(), moge::simd::isa::Cap::Level(l) if *l < moge::simd::isa::Isa::Amx))
    {
        moge::errln!("moge: warning: this CPU has AMX, but {why}: the avx512bf16 route runs instead");
    }
    let result = match cli.command {
        Command::Predict(a) => predict::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Download(a) => download::run(a),
        Command::Info(a) => info::run(a),
        Command::Batch(a) => batch::run(a),
        Command::Panorama(a) => panorama::run(a),
        Command::Colmap(a) => colmap::run(a),
        Command::Serve(a) => serve::run(a),
        Command::GenerateAssets(a) => assets::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            moge::errln!("moge: {e:#}");
            EXIT_FATAL
        }
    }
}
