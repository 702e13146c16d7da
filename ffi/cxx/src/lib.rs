//! The C++ face of [`moge::Predictor`], thin by design: `#include "moge/moge.h"` (the header cxx
//! generates from the bridge below) and link `moge::moge`.
//!
//! ```cpp
//! auto model = moge::load("vitl-normal", moge::default_load_options());
//! auto pred = model->infer_rgb(mat.data, mat.cols, mat.rows, mat.step, bgr_options);
//! cv::Mat depth(pred->height(), pred->width(), CV_32F, (void*)pred->depth().data());
//! ```
//!
//! Every error reaches C++ as a `rust::Error` whose `what()` is the command line's message, and
//! a panic inside a call becomes such an error ([`guarded`]): nothing unwinds across the
//! boundary. A [`Model`] may be used by several C++ threads at once (their forwards meet at the
//! model's device); a [`Prediction`] owns its maps, and its accessors hand out pointers into
//! them, so that a `cv::Mat` or an `Eigen::Map` wraps them without a copy.

use std::sync::Arc;

use moge::fit::{Canvas, FitMode};
use moge::protocol::PredictOptions;
use moge::remote::ClientOptions;
use moge::{Plan, Predictor};

#[cxx::bridge(namespace = "moge")]
mod ffi {
    /// How a model is loaded, as the command line's flags: `precision` `auto` | `f32` | `bf16`
    /// | `int8`, `device` `auto` | `cpu` | `cuda` | `cuda:N`, the hub `revision` of a published
    /// model; for a server, the seconds one request may take and its retries.
    struct LoadOptions {
        precision: String,
        device: String,
        revision: String,
        timeout_seconds: f64,
        retries: u32,
    }

    /// How an image meets the network, as the command line's options: `num_tokens` (0: 1800
    /// unless `resolution_level` is given) or `resolution_level` (0..=9, -1: not given),
    /// `fov_x` in degrees (0: estimated), `fov_x_exif` (`infer_file` only: each photo's own
    /// from its EXIF focal length, estimated where it has none), `apply_mask`,
    /// `force_projection`, `fit` `exact` |
    /// `pad` | `stretch` onto the canvas (0 x 0: 1920 x 1080), for `infer_rgb` whether the
    /// buffer is BGR (OpenCV's order) rather than RGB, and MoGe-3's `refine_steps` (-1: the
    /// model's default, 3 for MoGe-3; 0: the unrefined MoGe-2 output of the same network).
    struct Options {
        num_tokens: u32,
        resolution_level: i32,
        fov_x: f32,
        fov_x_exif: bool,
        apply_mask: bool,
        force_projection: bool,
        fit: String,
        canvas_width: u32,
        canvas_height: u32,
        bgr: bool,
        refine_steps: i32,
    }

    /// A pinhole camera: focal lengths and principal point.
    struct Intrinsics {
        fx: f32,
        fy: f32,
        cx: f32,
        cy: f32,
    }

    extern "Rust" {
        /// A loaded model, or a server as the device.
        type Model;
        /// One image's geometry.
        type Prediction;

        /// `precision` and `device` `auto`, the default revision, 60 s and 3 retries.
        fn default_load_options() -> LoadOptions;
        /// Upstream `infer()`'s defaults with the command line's 1800 tokens, RGB.
        fn default_options() -> Options;

        /// A published model (`vitl-normal`, ...: from the hub cache, downloaded when missing),
        /// a checkpoint path, or the URL of a running `moge serve` or Tenstorrent MoGe-2 server
        /// (tt-MoGe) (`http://host:port`).
        fn load(model_or_path: &str, options: &LoadOptions) -> Result<Box<Model>>;

        /// An 8-bit 3-channel image of `height` rows, each starting `row_stride` bytes after the
        /// last (at least `3 * width`), read in place.
        ///
        /// # Safety
        /// `data` points to `(height - 1) * row_stride + 3 * width` readable bytes (a cv::Mat cut
        /// from a larger one has them) for the length of the call.
        unsafe fn infer_rgb(self: &Model, data: *const u8, width: u32, height: u32, row_stride: usize, options: &Options) -> Result<Box<Prediction>>;
        /// A photo file, read as `moge predict` reads it (EXIF orientation applied, a damaged
        /// file refused with the reason); the maps equal `moge predict`'s npz bit for bit.
        fn infer_file(self: &Model, path: &str, options: &Options) -> Result<Box<Prediction>>;
        fn has_normal(self: &Model) -> bool;
        /// Where the network runs: `cpu`, `cuda:0`, or the server's address.
        fn device(self: &Model) -> String;

        fn width(self: &Prediction) -> usize;
        fn height(self: &Prediction) -> usize;
        /// (height, width, 3) metric points in the camera's frame (x right, y down, z forward),
        /// +inf where masked.
        fn points(self: &Prediction) -> &[f32];
        /// (height, width) metric depth, +inf where masked.
        fn depth(self: &Prediction) -> &[f32];
        /// (height, width, 3) unit normals, zero where masked; empty without a normal head.
        fn normal(self: &Prediction) -> &[f32];
        fn has_normal(self: &Prediction) -> bool;
        /// (height, width), 1 where valid, 0 elsewhere.
        fn mask(self: &Prediction) -> &[u8];
        /// Normalised: the image is the unit square.
        fn intrinsics(self: &Prediction) -> Intrinsics;
        /// In pixels.
        fn intrinsics_pixels(self: &Prediction) -> Intrinsics;
        fn metric_scale(self: &Prediction) -> f32;
        /// Fields of view, in degrees.
        fn fov_x(self: &Prediction) -> f32;
        fn fov_y(self: &Prediction) -> f32;
        /// The depth as `moge predict --format png` writes it: 16-bit, `metres_per_unit` metres
        /// per unit (0.001: millimetres), 0 where invalid. The valid pixels clamped at 65535.
        fn save_depth_png(self: &Prediction, path: &str, metres_per_unit: f32) -> Result<usize>;
        /// The npz of `moge predict` (`np.load` reads it).
        fn save_npz(self: &Prediction, path: &str) -> Result<()>;
    }
}

pub struct Model {
    predictor: Arc<Predictor>,
}

// C++ threads share one Model (the bridge's promise); a Prediction may move between them.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<Model>();
    shared::<Prediction>();
};

pub struct Prediction {
    pred: moge::Prediction,
}

/// Why a call failed: the command line's message, `rust::Error::what()` on the C++ side.
#[derive(Debug)]
pub struct Failure(String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `f`'s result, its error (or a panic in it) as one line: no panic unwinds into C++.
fn guarded<T>(f: impl FnOnce() -> anyhow::Result<T>) -> Result<T, Failure> {
    moge::pipeline::guard::install_panic_hook();
    moge::pipeline::guard::guarded(f).map_err(|e| Failure(moge::console::error_line(&e)))
}

fn default_load_options() -> ffi::LoadOptions {
    let load = moge::LoadOptions::default();
    let client = ClientOptions::default();
    ffi::LoadOptions {
        precision: "auto".into(),
        device: "auto".into(),
        revision: load.revision,
        timeout_seconds: client.timeout.as_secs_f64(),
        retries: client.retries,
    }
}

fn default_options() -> ffi::Options {
    let infer = moge::InferOptions::default();
    ffi::Options {
        num_tokens: 0,
        resolution_level: -1,
        fov_x: 0.0,
        fov_x_exif: false,
        apply_mask: infer.apply_mask,
        force_projection: infer.force_projection,
        fit: FitMode::Exact.name().into(),
        canvas_width: 0,
        canvas_height: 0,
        bgr: false,
        refine_steps: -1,
    }
}

fn load(model_or_path: &str, options: &ffi::LoadOptions) -> Result<Box<Model>, Failure> {
    guarded(|| {
        let predictor = if model_or_path.contains("://") {
            let t = options.timeout_seconds;
            anyhow::ensure!(t.is_finite() && t > 0.0, "timeout {t} is not a positive number of seconds");
            let opts = ClientOptions { timeout: std::time::Duration::from_secs_f64(t), retries: options.retries, ..Default::default() };
            Predictor::connect(model_or_path, opts)?
        } else {
            let precision = match options.precision.as_str() {
                "auto" => None,
                p => Some(p.parse::<moge::Precision>()?),
            };
            let device = options.device.parse().map_err(anyhow::Error::msg)?;
            let opts = moge::LoadOptions { precision, device, revision: options.revision.clone() };
            Predictor::load(model_or_path, &opts)?
        };
        Ok(Box::new(Model { predictor: Arc::new(predictor) }))
    })
}

/// The plan of `o`, checked as the command line checks its flags.
fn plan(o: &ffi::Options) -> anyhow::Result<Plan> {
    let fit: FitMode = o.fit.parse()?;
    let resolution_level = match o.resolution_level {
        -1 => None,
        l => Some(u32::try_from(l).map_err(|_| anyhow::anyhow!("resolution_level {l} is not 0..=9 (or -1: not given)"))?),
    };
    let refine_steps = match o.refine_steps {
        -1 => None,
        n => Some(u32::try_from(n).map_err(|_| anyhow::anyhow!("refine_steps {n} is not 0 or more (or -1: the model's default)"))?),
    };
    let request = PredictOptions {
        refine_steps,
        fit: Some(fit),
        fov_x: (o.fov_x != 0.0).then_some(o.fov_x),
        apply_mask: Some(o.apply_mask),
        force_projection: Some(o.force_projection),
        num_tokens: (o.num_tokens != 0).then_some(o.num_tokens),
        resolution_level,
        ..Default::default()
    };
    let canvas = match (o.canvas_width, o.canvas_height) {
        (0, 0) => Canvas::FULL_HD,
        (w, h) => format!("{w}x{h}").parse::<Canvas>().map_err(anyhow::Error::msg)?,
    };
    anyhow::ensure!(!(o.fov_x_exif && o.fov_x != 0.0), "fov_x {} and fov_x_exif: give one of them", o.fov_x);
    let fov = if o.fov_x_exif { moge::image_io::FovFrom::Exif } else { moge::image_io::FovFrom::Estimate };
    Ok(Plan { fov, ..Plan::from_request(&request, canvas).map_err(anyhow::Error::msg)? })
}

impl Model {
    /// # Safety
    /// As the bridge says: `data` holds `height * row_stride` bytes.
    unsafe fn infer_rgb(&self, data: *const u8, width: u32, height: u32, row_stride: usize, options: &ffi::Options) -> Result<Box<Prediction>, Failure> {
        guarded(|| {
            let plan = plan(options)?;
            anyhow::ensure!(!data.is_null(), "the image's data pointer is null");
            anyhow::ensure!(moge::image_io::is_supported_size(width, height), "a {width}x{height} image is not a size moge reads");
            let row = 3 * width as usize;
            anyhow::ensure!(row_stride >= row, "a row stride of {row_stride} bytes is shorter than a row of {width} pixels ({row} bytes)");
            let len = row_stride.checked_mul(height as usize - 1).and_then(|n| n.checked_add(row));
            let len = len.filter(|&n| n <= isize::MAX as usize);
            let len = len.ok_or_else(|| anyhow::anyhow!("a {width}x{height} image with a row stride of {row_stride} bytes does not fit in memory"))?;
            // SAFETY: the caller gives `(height - 1) * row_stride + 3 * width` readable bytes
            // (the bridge's contract), which is `len`, at most isize::MAX.
            let bytes = unsafe { std::slice::from_raw_parts(data, len) };
            let mut photo = image::RgbImage::new(width, height);
            for (dst, src) in photo.chunks_exact_mut(row).zip(bytes.chunks(row_stride)) {
                let src = &src[..row];
                if options.bgr {
                    for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(3)) {
                        d.copy_from_slice(&[s[2], s[1], s[0]]);
                    }
                } else {
                    dst.copy_from_slice(src);
                }
            }
            let pred = self.predictor.predict_rgb(&photo, &plan)?;
            Ok(Box::new(Prediction { pred }))
        })
    }

    fn infer_file(&self, path: &str, options: &ffi::Options) -> Result<Box<Prediction>, Failure> {
        guarded(|| {
            let plan = plan(options)?;
            Ok(Box::new(Prediction { pred: self.predictor.predict_file(path.as_ref(), &plan)? }))
        })
    }

    fn has_normal(&self) -> bool {
        self.predictor.has_normal()
    }

    fn device(&self) -> String {
        self.predictor.device()
    }
}

fn intrinsics(k: [[f32; 3]; 3]) -> ffi::Intrinsics {
    ffi::Intrinsics { fx: k[0][0], fy: k[1][1], cx: k[0][2], cy: k[1][2] }
}

impl Prediction {
    fn width(&self) -> usize {
        self.pred.width
    }

    fn height(&self) -> usize {
        self.pred.height
    }

    fn points(&self) -> &[f32] {
        &self.pred.points
    }

    fn depth(&self) -> &[f32] {
        &self.pred.depth
    }

    fn normal(&self) -> &[f32] {
        self.pred.normal.as_deref().unwrap_or_default()
    }

    fn has_normal(&self) -> bool {
        self.pred.normal.is_some()
    }

    fn mask(&self) -> &[u8] {
        // A bool is one byte holding 0 or 1.
        bytemuck::cast_slice(&self.pred.mask)
    }

    fn intrinsics(&self) -> ffi::Intrinsics {
        intrinsics(self.pred.intrinsics)
    }

    fn intrinsics_pixels(&self) -> ffi::Intrinsics {
        intrinsics(self.pred.intrinsics_pixels())
    }

    fn metric_scale(&self) -> f32 {
        self.pred.metric_scale
    }

    fn fov_x(&self) -> f32 {
        self.pred.fov_degrees().0
    }

    fn fov_y(&self) -> f32 {
        self.pred.fov_degrees().1
    }

    fn save_depth_png(&self, path: &str, metres_per_unit: f32) -> Result<usize, Failure> {
        guarded(|| {
            anyhow::ensure!(metres_per_unit.is_finite() && metres_per_unit > 0.0, "a depth PNG scale of {metres_per_unit} metres per unit is not positive");
            moge::outputs::png::write_depth(path.as_ref(), &self.pred, metres_per_unit)
        })
    }

    fn save_npz(&self, path: &str) -> Result<(), Failure> {
        guarded(|| moge::outputs::npz::write(path.as_ref(), &self.pred, Default::default(), Default::default()))
    }
}
