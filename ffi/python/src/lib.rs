//! `moge_rs._native`: the Python face of [`moge::Predictor`], thin by design. Input forms
//! (paths, PIL, numpy, torch) are told apart in `python/moge_rs/__init__.py`; here arrive
//! only a path, an (H, W, 3) uint8 array or a (3, H, W) float32 array. The GIL is released
//! around every call that does real work, and every Rust error becomes a Python exception
//! in one place ([`py_err`]).

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use moge::fit::{Canvas, FitMode};
use moge::image_io::FovFrom;
use moge::protocol::PredictOptions;
use moge::{Plan, Prediction, Predictor};
use numpy::ndarray::{ArrayView, Dimension};
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray2, PyReadonlyArray3, PyUntypedArrayMethods};
use pyo3::exceptions::{PyConnectionError, PyFileNotFoundError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

pyo3::create_exception!(moge_rs, MoGeError, PyRuntimeError, "A photo, checkpoint or server that moge could not use; the message says which and why.");

/// The one mapping of Rust errors to Python's: a missing file is `FileNotFoundError`, a server
/// that cannot be reached `ConnectionError`, anything else `MoGeError`; the message is the
/// command line's.
fn py_err(e: anyhow::Error) -> PyErr {
    let line = moge::console::error_line(&e);
    let missing = e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound));
    let unreachable = e.chain().any(|c| c.downcast_ref::<moge::remote::RemoteError>().is_some_and(moge::remote::RemoteError::is_unreachable));
    if unreachable {
        PyConnectionError::new_err(line)
    } else if missing {
        PyFileNotFoundError::new_err(line)
    } else {
        MoGeError::new_err(line)
    }
}

/// How one image meets the network: `model(image, ...)`'s keywords, checked once.
#[pyclass(frozen, module = "moge_rs._native")]
struct Options {
    plan: Plan,
}

#[pymethods]
impl Options {
    #[new]
    #[pyo3(signature = (*, fit="exact", fov_x=None, apply_mask=true, force_projection=true, num_tokens=None, resolution_level=None, canvas=None, refine_steps=None, return_per_step=false))]
    #[allow(clippy::too_many_arguments)] // the keywords of `model(image, ...)`
    fn new(
        fit: &str,
        fov_x: Option<&Bound<'_, PyAny>>,
        apply_mask: bool,
        force_projection: bool,
        num_tokens: Option<u32>,
        resolution_level: Option<u32>,
        canvas: Option<(u32, u32)>,
        refine_steps: Option<u32>,
        return_per_step: bool,
    ) -> PyResult<Self> {
        let fit: FitMode = fit.parse().map_err(|e: moge::names::UnknownName| PyValueError::new_err(e.to_string()))?;
        // Degrees for every image, or "exif": each photo file's own, from its EXIF focal length.
        let (fov_x, fov) = match fov_x {
            None => (None, FovFrom::Estimate),
            Some(v) => match v.extract::<String>() {
                Ok(s) if s == "exif" => (None, FovFrom::Exif),
                Ok(s) => return Err(PyValueError::new_err(format!("fov_x {s:?} is not a number of degrees or \"exif\""))),
                Err(_) => (Some(v.extract::<f32>()?), FovFrom::Estimate),
            },
        };
        let request = PredictOptions {
            fit: Some(fit),
            fov_x,
            apply_mask: Some(apply_mask),
            force_projection: Some(force_projection),
            num_tokens,
            resolution_level,
            refine_steps,
            ..Default::default()
        };
        let canvas = match canvas {
            Some((width, height)) => format!("{width}x{height}").parse::<Canvas>().map_err(PyValueError::new_err)?,
            None => Canvas::FULL_HD,
        };
        let mut plan = Plan { fov, ..Plan::from_request(&request, canvas).map_err(PyValueError::new_err)? };
        plan.infer.per_step = return_per_step;
        Ok(Self { plan })
    }
}

/// A loaded model (or a server), shared by every Python thread that holds it.
#[pyclass(frozen, module = "moge_rs._native")]
struct Model {
    /// `None` once closed; each call holds its own reference, so a close during a call waits
    /// for nothing and frees the model when the last call ends.
    inner: RwLock<Option<Arc<Predictor>>>,
}

impl Model {
    fn get(&self) -> PyResult<Arc<Predictor>> {
        let guard = self.inner.read().unwrap_or_else(|e| e.into_inner());
        guard.clone().ok_or_else(|| MoGeError::new_err("the model is closed"))
    }

    fn wrap(p: Predictor) -> Self {
        Self { inner: RwLock::new(Some(Arc::new(p))) }
    }

    /// The dict of `predict_panorama` and `predict_panorama_file`.
    fn panorama<'py>(&self, py: Python<'py>, photo: &image::RgbImage, opts: &Bound<'py, Options>, view_size: usize) -> PyResult<Bound<'py, PyDict>> {
        let (p, plan) = (self.get()?, &opts.get().plan);
        let pano = py.detach(|| p.predict_panorama(photo, plan, view_size)).map_err(py_err)?;
        let (h, w) = (photo.height() as usize, photo.width() as usize);
        let d = PyDict::new(py);
        let q = pano.prediction;
        d.set_item("points", PyArray1::from_vec(py, q.points).reshape([h, w, 3])?)?;
        d.set_item("depth", PyArray1::from_vec(py, q.depth).reshape([h, w])?)?;
        d.set_item("mask", PyArray1::from_vec(py, q.mask).reshape([h, w])?)?;
        d.set_item("metric_scale", q.metric_scale)?;
        d.set_item("view_metric_scale", PyArray1::from_vec(py, pano.view_metric_scales))?;
        Ok(d)
    }
}

#[pymethods]
impl Model {
    /// A published name (`vitl-normal`, ...; from the hub cache, downloaded when missing) or a
    /// checkpoint path.
    #[staticmethod]
    #[pyo3(signature = (model, *, revision=None, precision="auto", device="auto", jobs=None))]
    fn load(py: Python<'_>, model: &str, revision: Option<&str>, precision: &str, device: &str, jobs: Option<usize>) -> PyResult<Self> {
        let precision = match precision {
            "auto" => None,
            p => Some(p.parse::<moge::Precision>().map_err(|e| PyValueError::new_err(e.to_string()))?),
        };
        let device = device.parse().map_err(PyValueError::new_err)?;
        let mut opts = moge::LoadOptions { precision, device, ..Default::default() };
        if let Some(r) = revision {
            opts.revision = r.to_owned();
        }
        let p = py.detach(|| Predictor::load(model, &opts)).map_err(py_err)?;
        Ok(Self::wrap(with_jobs(p, jobs)))
    }

    /// A running `moge serve` or Tenstorrent MoGe-2 server (tt-MoGe) as the device.
    #[staticmethod]
    #[pyo3(signature = (url, *, timeout=60.0, retries=3, jobs=None))]
    fn connect(py: Python<'_>, url: &str, timeout: f64, retries: u32, jobs: Option<usize>) -> PyResult<Self> {
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(PyValueError::new_err(format!("timeout {timeout} is not a positive number of seconds")));
        }
        let opts = moge::remote::ClientOptions { timeout: std::time::Duration::from_secs_f64(timeout), retries, ..Default::default() };
        let p = py.detach(|| Predictor::connect(url, opts)).map_err(py_err)?;
        Ok(Self::wrap(with_jobs(p, jobs)))
    }

    fn close(&self) {
        self.inner.write().unwrap_or_else(|e| e.into_inner()).take();
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    #[getter]
    fn has_normal(&self) -> PyResult<bool> {
        Ok(self.get()?.has_normal())
    }

    #[getter]
    fn device(&self) -> PyResult<String> {
        Ok(self.get()?.device())
    }

    #[getter]
    fn server(&self) -> PyResult<Option<String>> {
        Ok(self.get()?.server().map(str::to_owned))
    }

    /// A photo file, read as `moge predict` reads it.
    fn predict_file<'py>(&self, py: Python<'py>, path: PathBuf, opts: &Bound<'py, Options>) -> PyResult<Bound<'py, PyDict>> {
        let (p, plan) = (self.get()?, &opts.get().plan);
        let pred = py.detach(|| p.predict_file(&path, plan)).map_err(py_err)?;
        output(py, pred)
    }

    /// A photo file's bytes (a dataset's column, object storage), decoded as `predict_file`
    /// decodes the file; `name` is how errors name it.
    fn predict_bytes<'py>(&self, py: Python<'py>, data: &[u8], name: &str, opts: &Bound<'py, Options>) -> PyResult<Bound<'py, PyDict>> {
        let (p, plan) = (self.get()?, &opts.get().plan);
        let bytes = data.to_vec();
        let pred = py.detach(|| p.predict_bytes(bytes, name, plan)).map_err(py_err)?;
        output(py, pred)
    }

    /// An (H, W, 3) uint8 RGB array.
    fn predict_rgb<'py>(&self, py: Python<'py>, image: PyReadonlyArray3<'py, u8>, opts: &Bound<'py, Options>) -> PyResult<Bound<'py, PyDict>> {
        let (p, plan) = (self.get()?, &opts.get().plan);
        let &[h, w, c] = image.shape() else { unreachable!("a 3-d array") };
        if c != 3 {
            return Err(PyValueError::new_err(format!("an 8-bit image is H x W x 3 (RGB); this one is {h} x {w} x {c}")));
        }
        supported(w, h)?;
        let data = contiguous(&image.as_array()).into_owned();
        let photo = image::RgbImage::from_raw(w as u32, h as u32, data).ok_or_else(|| PyValueError::new_err("internal: the pixels do not fill the image"))?;
        let pred = py.detach(|| p.predict_rgb(&photo, plan)).map_err(py_err)?;
        output(py, pred)
    }

    /// A (3, H, W) float32 array in [0, 1], as upstream `infer()` takes a tensor.
    fn predict_float<'py>(&self, py: Python<'py>, image: PyReadonlyArray3<'py, f32>, opts: &Bound<'py, Options>) -> PyResult<Bound<'py, PyDict>> {
        let (p, plan) = (self.get()?, &opts.get().plan);
        let &[c, h, w] = image.shape() else { unreachable!("a 3-d array") };
        if c != 3 {
            return Err(PyValueError::new_err(format!("a float image is 3 x H x W; this one is {c} x {h} x {w}")));
        }
        supported(w, h)?;
        let view = image.as_array();
        let planar = contiguous(&view);
        let pred = py.detach(|| p.predict_float(&planar, w, h, plan)).map_err(py_err)?;
        output(py, pred)
    }

    /// An (H, W, 3) uint8 RGB equirectangular panorama (W = 2H): twelve `view_size` views
    /// merged at metric scale (`moge panorama`). Returns points (H, W, 3) in moge's axes, depth
    /// (the distance from the centre), mask, metric_scale and view_metric_scale.
    fn predict_panorama<'py>(
        &self,
        py: Python<'py>,
        image: PyReadonlyArray3<'py, u8>,
        opts: &Bound<'py, Options>,
        view_size: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        let &[h, w, c] = image.shape() else { unreachable!("a 3-d array") };
        if c != 3 {
            return Err(PyValueError::new_err(format!("a panorama is H x W x 3 (RGB, 8-bit); this one is {h} x {w} x {c}")));
        }
        supported(w, h)?;
        let data = contiguous(&image.as_array()).into_owned();
        let photo = image::RgbImage::from_raw(w as u32, h as u32, data).ok_or_else(|| PyValueError::new_err("internal: the pixels do not fill the image"))?;
        self.panorama(py, &photo, opts, view_size)
    }

    /// A panorama's file, read as `moge panorama` reads it.
    fn predict_panorama_file<'py>(&self, py: Python<'py>, path: PathBuf, opts: &Bound<'py, Options>, view_size: usize) -> PyResult<Bound<'py, PyDict>> {
        let photo = py.detach(|| moge::image_io::load_rgb_with(&path, &Default::default())).map_err(py_err)?.image;
        self.panorama(py, &photo, opts, view_size)
    }

    /// Photo files through the pipeline, their outputs in order.
    fn predict_many(&self, py: Python<'_>, paths: Vec<PathBuf>, opts: &Bound<'_, Options>) -> PyResult<Predictions> {
        let (p, plan) = (self.get()?, opts.get().plan.clone());
        let it = py.detach(|| p.predict_many(paths, &plan)).map_err(py_err)?;
        Ok(Predictions { inner: Mutex::new(Some(it)) })
    }
}

/// `predict_many`'s host threads per stage (decode, post-process), where given.
fn with_jobs(mut p: Predictor, jobs: Option<usize>) -> Predictor {
    if let Some(j) = jobs {
        p.jobs = j.max(1);
    }
    p
}

fn supported(w: usize, h: usize) -> PyResult<()> {
    if u32::try_from(w).is_ok_and(|w| u32::try_from(h).is_ok_and(|h| moge::image_io::is_supported_size(w, h))) {
        Ok(())
    } else {
        Err(PyValueError::new_err(format!("a {w}x{h} image is outside the sizes moge reads (at least 8x8)")))
    }
}

/// The iterator of `predict_many`: one output dict per path, in order; a failed photo raises
/// its error when its turn comes.
#[pyclass(module = "moge_rs._native")]
struct Predictions {
    inner: Mutex<Option<moge::Predictions>>,
}

#[pymethods]
impl Predictions {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let next = py.detach(|| self.inner.lock().unwrap_or_else(|e| e.into_inner()).as_mut().and_then(Iterator::next));
        match next {
            None => Ok(None),
            Some(r) => output(py, r.map_err(py_err)?).map(Some),
        }
    }

    fn __len__(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map_or(0, moge::Predictions::remaining)
    }

    /// Stops the pipeline: the photo on the device finishes, nothing new starts.
    fn close(&self, py: Python<'_>) {
        let it = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(move || drop(it));
    }
}

/// A prediction as a dict of numpy arrays that own the prediction's buffers (no copy).
fn output(py: Python<'_>, mut p: Prediction) -> PyResult<Bound<'_, PyDict>> {
    let (h, w) = (p.height, p.width);
    let d = PyDict::new(py);
    // MoGe-3 with return_per_step: each step's maps (step 0 unrefined, the last the final).
    let steps = std::mem::take(&mut p.per_step);
    if steps.is_empty() {
        d.set_item("per_step", py.None())?;
    } else {
        let list = pyo3::types::PyList::empty(py);
        for s in steps {
            let e = PyDict::new(py);
            e.set_item("intrinsics", PyArray2::from_owned_array(py, numpy::ndarray::arr2(&s.intrinsics)))?;
            e.set_item("points", PyArray1::from_vec(py, s.points).reshape([h, w, 3])?)?;
            e.set_item("depth", PyArray1::from_vec(py, s.depth).reshape([h, w])?)?;
            e.set_item("mask", PyArray1::from_vec(py, s.mask).reshape([h, w])?)?;
            list.append(e)?;
        }
        d.set_item("per_step", list)?;
    }
    let (fx, fy) = p.fov_degrees();
    d.set_item("summary", p.summary())?;
    d.set_item("intrinsics", PyArray2::from_owned_array(py, numpy::ndarray::arr2(&p.intrinsics)))?;
    d.set_item("intrinsics_pixels", PyArray2::from_owned_array(py, numpy::ndarray::arr2(&p.intrinsics_pixels())))?;
    d.set_item("metric_scale", p.metric_scale)?;
    d.set_item("fov_x", fx)?;
    d.set_item("fov_y", fy)?;
    d.set_item("points", PyArray1::from_vec(py, p.points).reshape([h, w, 3])?)?;
    d.set_item("depth", PyArray1::from_vec(py, p.depth).reshape([h, w])?)?;
    let normal = match p.normal {
        Some(n) => Some(PyArray1::from_vec(py, n).reshape([h, w, 3])?),
        None => None,
    };
    d.set_item("normal", normal)?;
    d.set_item("mask", PyArray1::from_vec(py, p.mask).reshape([h, w])?)?;
    Ok(d)
}

/// The `moge` command line, the binary's own source: the wheel's `moge` entry point.
#[path = "../../../src/cli/mod.rs"]
#[allow(dead_code)] // `cli::main`, the binary's entry, is not this library's
mod cli;

/// Runs the command line on `args` (the first is the program's name) with the GIL released;
/// returns its exit status. For `moge_rs._cli`, in a process of its own: the command may exit
/// the process itself (`--help`, a usage error), as the binary does.
#[pyfunction]
fn cli_main(py: Python<'_>, args: Vec<std::ffi::OsString>) -> i32 {
    py.detach(|| cli::main_from(args))
}

/// Sets the number of threads of this process's forwards (the CPU kernels' pool) to `n`,
/// before the first forward: `False` if that pool had already started, with its own size.
/// For engines that give each worker process a share of the machine's cores (Ray's actors).
#[pyfunction]
fn set_threads(n: usize) -> PyResult<bool> {
    if !(1..=1024).contains(&n) {
        return Err(PyValueError::new_err(format!("threads is {n}; it must be between 1 and 1024")));
    }
    Ok(rayon::ThreadPoolBuilder::new().num_threads(n).build_global().is_ok())
}

/// Keeps freed memory in this process from now on (glibc), as the `moge` binary does: 15 % of a
/// forward's speed, for a footprint kept at its peak. For processes that only predict.
#[pyfunction]
fn keep_freed_memory() {
    moge::memory::keep_freed_memory();
}

/// How many threads this process's forwards use.
#[pyfunction]
fn threads() -> usize {
    rayon::current_num_threads()
}

/// The npz of `moge predict` (same bytes) from an output's arrays.
#[pyfunction]
#[pyo3(signature = (path, points, depth, normal, mask, intrinsics, metric_scale))]
#[allow(clippy::too_many_arguments)] // the npz's arrays, each named as in the file
fn save_npz(
    py: Python<'_>,
    path: PathBuf,
    points: PyReadonlyArray3<'_, f32>,
    depth: PyReadonlyArray2<'_, f32>,
    normal: Option<PyReadonlyArray3<'_, f32>>,
    mask: PyReadonlyArray2<'_, bool>,
    intrinsics: PyReadonlyArray2<'_, f32>,
    metric_scale: f32,
) -> PyResult<()> {
    let &[h, w] = depth.shape() else { unreachable!("a 2-d array") };
    let maps = |name: &str, shape: &[usize], want: &[usize]| {
        if shape == want {
            Ok(())
        } else {
            Err(PyValueError::new_err(format!("{name} is {shape:?}; with depth {h} x {w} it must be {want:?}")))
        }
    };
    maps("points", points.shape(), &[h, w, 3])?;
    maps("mask", mask.shape(), &[h, w])?;
    maps("intrinsics", intrinsics.shape(), &[3, 3])?;
    if let Some(n) = &normal {
        maps("normal", n.shape(), &[h, w, 3])?;
    }
    let k = intrinsics.as_array();
    let pred = Prediction {
        width: w,
        height: h,
        points: contiguous(&points.as_array()).into_owned(),
        depth: contiguous(&depth.as_array()).into_owned(),
        normal: normal.map(|n| contiguous(&n.as_array()).into_owned()),
        normal_png: None,
        mask: contiguous(&mask.as_array()).into_owned(),
        intrinsics: std::array::from_fn(|i| std::array::from_fn(|j| k[[i, j]])),
        metric_scale,
        focal: 0.0,
        shift: 0.0,
        per_step: Vec::new(),
        grid: (0, 0),
    };
    let out = moge::outputs::OutputOptions::default();
    py.detach(|| moge::outputs::npz::write(&path, &pred, out.npz_compression, out.npz_normal)).map_err(py_err)
}

/// An array's elements in C order: its own memory where it is C-contiguous, else a copy.
fn contiguous<'a, T: Copy, D: Dimension>(a: &'a ArrayView<'_, T, D>) -> Cow<'a, [T]> {
    match a.as_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().copied().collect()),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_class::<Options>()?;
    m.add_class::<Predictions>()?;
    m.add_function(wrap_pyfunction!(save_npz, m)?)?;
    m.add_function(wrap_pyfunction!(set_threads, m)?)?;
    m.add_function(wrap_pyfunction!(threads, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(keep_freed_memory, m)?)?;
    m.add("MoGeError", m.py().get_type::<MoGeError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
