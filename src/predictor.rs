//! One face for programs and the bindings (Python, C++): a model here or on a server, asked
//! for one image at a time from any thread, or for a list through the pipeline with the
//! predictions handed back in order.
//!
//! ```
//! let opts = moge::LoadOptions { device: moge::DeviceRequest::Cpu, ..Default::default() };
//! let predictor = moge::Predictor::load("tests/fixtures/tiny_normal.pt", &opts)?;
//! let plan = moge::Plan::default();
//! let one = predictor.predict_file("tests/fixtures/images/rgb_40x72.png".as_ref(), &plan)?;
//! let photos = vec!["tests/fixtures/images/rgb_40x72.png".into(), "tests/fixtures/images/gray_50x50.png".into()];
//! let many: Vec<_> = predictor.predict_many(photos, &plan)?.collect();
//! assert_eq!(many.len(), 2);
//! assert_eq!(many[0].as_ref().unwrap().depth, one.depth);
//! # Ok::<(), anyhow::Error>(())
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use crossbeam_channel::{bounded, Receiver};
use image::RgbImage;

use crate::fit::FitMode;
use crate::image_io::{DecodeOptions, FovFrom};
use crate::infer::Prediction;
use crate::loader::LoadOptions;
use crate::model::Runner;
use crate::pipeline::guard::guarded;
use crate::pipeline::plan::{self, Plan};
use crate::pipeline::remote;
use crate::pipeline::run::{Config, Engine};
use crate::remote::{Client, ClientOptions};

/// Where a predictor's forwards run.
enum Middle {
    Local(Runner),
    Remote(Arc<Client>),
}

/// A model ready to predict, here or on a server. Shared by reference across threads: the
/// calls of several threads on one local model run side by side on its device.
pub struct Predictor {
    middle: Middle,
    /// The pipeline's jobs per host stage for [`Predictor::predict_many`].
    pub jobs: usize,
}

impl Predictor {
    /// A model by published name or checkpoint path, as [`crate::loader::load`] loads it.
    pub fn load(model: &str, opts: &LoadOptions) -> Result<Self> {
        Ok(Self::local(Arc::new(crate::loader::load(model, opts)?)))
    }

    /// A model already loaded.
    pub fn local(model: Arc<crate::model::v2::Model>) -> Self {
        Self { middle: Middle::Local(Runner::new(model)), jobs: crate::pipeline::run::default_jobs() }
    }

    /// A running `moge serve` or Tenstorrent MoGe-2 server (tt-MoGe) at `url` as the device.
    pub fn connect(url: &str, opts: ClientOptions) -> Result<Self> {
        let client = Arc::new(Client::connect(url, opts)?);
        Ok(Self { middle: Middle::Remote(client), jobs: crate::pipeline::run::default_jobs() })
    }

    /// The local model, `None` on a server.
    pub fn model(&self) -> Option<&Arc<crate::model::v2::Model>> {
        match &self.middle {
            Middle::Local(runner) => Some(runner.model()),
            Middle::Remote(_) => None,
        }
    }

    /// The server's address, `None` for a local model.
    pub fn server(&self) -> Option<&str> {
        match &self.middle {
            Middle::Local(_) => None,
            Middle::Remote(client) => Some(client.url()),
        }
    }

    /// Whether the model predicts normals.
    pub fn has_normal(&self) -> bool {
        match &self.middle {
            Middle::Local(runner) => runner.model().has_normal(),
            Middle::Remote(client) => client.has_normal(),
        }
    }

    /// Where the network runs: `cpu`, `cuda:0`, or the server's address.
    pub fn device(&self) -> String {
        match &self.middle {
            Middle::Local(runner) => crate::device::name_of(&runner.model().device),
            Middle::Remote(client) => format!("{} ({})", client.url(), client.device().unwrap_or("device")),
        }
    }

    /// One 8-bit RGB image, as `moge predict` runs a photo once decoded.
    pub fn predict_rgb(&self, photo: &RgbImage, plan: &Plan) -> Result<Prediction> {
        check(plan)?;
        let plan = &*plan.for_pixels(photo.width(), photo.height())?;
        guarded(|| match &self.middle {
            Middle::Local(runner) => {
                let placed = plan::prepare(runner.model(), photo, plan)?;
                let raw = runner.forward(&placed.prep).context("forward failed")?;
                Ok(plan::finish(runner.model(), &placed, &raw, plan))
            }
            Middle::Remote(_) => {
                let png = crate::remote::png_for_server(photo)?;
                self.remote(&png, photo, plan)
            }
        })
    }

    /// One planar (3, H, W) float image in [0, 1], as upstream `infer()` takes a tensor: resized
    /// as floats, never rounded to 8 bits here. A server takes 8-bit images: there it is rounded.
    pub fn predict_float(&self, planar: &[f32], width: usize, height: usize, plan: &Plan) -> Result<Prediction> {
        check(plan)?;
        if planar.len() != 3 * width * height || !crate::image_io::is_supported_size(width as u32, height as u32) {
            bail!("a {width}x{height} float image needs 3 x {height} x {width} values, and a size moge reads (got {} values)", planar.len());
        }
        let plan = &*plan.for_pixels(width as u32, height as u32)?;
        if plan.fit != FitMode::Exact {
            bail!("fit {} takes 8-bit images; a float image runs at its own size (fit exact)", plan.fit.name());
        }
        guarded(|| match &self.middle {
            Middle::Local(runner) => {
                let model = runner.model();
                let prep = model
                    .prepare_float(planar, width, height, plan.infer.tokens(model.config.num_tokens_range))
                    .refined(model.refine_steps(&plan.infer), plan.infer.per_step);
                let raw = runner.forward(&prep).context("forward failed")?;
                Ok(model.postprocess(&raw, (width, height, prep.grid), &plan.infer))
            }
            Middle::Remote(_) => {
                let plane = width * height;
                let to8 = |v: f32| (v.clamp(0.0, 1.0) * 255.0).round() as u8;
                let photo = RgbImage::from_fn(width as u32, height as u32, |x, y| {
                    let i = y as usize * width + x as usize;
                    image::Rgb([to8(planar[i]), to8(planar[plane + i]), to8(planar[2 * plane + i])])
                });
                self.predict_rgb(&photo, plan)
            }
        })
    }

    /// A photo file, read as `moge predict` reads it (EXIF orientation applied, damaged files
    /// refused with the reason); the prediction equals `moge predict`'s npz bit for bit.
    pub fn predict_file(&self, path: &Path, plan: &Plan) -> Result<Prediction> {
        check(plan)?;
        let loaded = crate::image_io::load_with_source(path, &decode_options(plan))?;
        self.predict_loaded(loaded, plan).with_context(|| path.display().to_string())
    }

    /// A photo file's bytes, held in memory (read from object storage, a dataset's column),
    /// decoded as [`Predictor::predict_file`] decodes the file: the same prediction. `name`
    /// (the file's name or address) is how errors name it.
    pub fn predict_bytes(&self, bytes: Vec<u8>, name: &str, plan: &Plan) -> Result<Prediction> {
        check(plan)?;
        let (decoded, source) = crate::image_io::decode_bytes_with_source(&bytes, &decode_options(plan)).with_context(|| name.to_owned())?;
        self.predict_loaded(crate::image_io::Loaded { decoded, source, bytes }, plan).with_context(|| name.to_owned())
    }

    /// A decoded photo, with the field of view its file gave (EXIF, camera matrix) used.
    fn predict_loaded(&self, loaded: crate::image_io::Loaded, plan: &Plan) -> Result<Prediction> {
        let plan = Plan { fov: FovFrom::Estimate, ..plan.with_known_fov(loaded.decoded.known_fov.as_ref()).into_owned() };
        match &self.middle {
            Middle::Local(_) => self.predict_rgb(&loaded.decoded.image, &plan),
            Middle::Remote(_) => {
                let send = crate::remote::image_for_server(&loaded.bytes, &loaded.source, &loaded.decoded.image)?;
                self.remote(&send, &loaded.decoded.image, &plan)
            }
        }
    }

    /// An equirectangular panorama (twice as wide as high), as upstream's `moge infer_panorama`
    /// makes it: twelve `view_size`² views ([`crate::panorama::VIEW_SIZE`] is upstream's)
    /// through the model with their 90° field of view given, merged into one distance map
    /// that carries the views' metric scale (see [`crate::panorama`]). The plan's options apply
    /// to every view (tokens, resolution level), its `apply_mask` to the panorama; a field of
    /// view or a fit other than exact is refused.
    pub fn predict_panorama(&self, photo: &RgbImage, plan: &Plan, view_size: usize) -> Result<crate::panorama::Panorama> {
        use crate::panorama::{cameras, split};
        check(plan)?;
        crate::panorama::check_size(photo.width(), photo.height()).map_err(anyhow::Error::msg)?;
        if plan.infer.fov_x.is_some() || plan.fov != FovFrom::Estimate || plan.fit != FitMode::Exact {
            bail!("a panorama's views have their own field of view (90°) and run at their own size: no fov_x, no fit");
        }
        if !(64..=4096).contains(&view_size) {
            bail!("a view size of {view_size} pixels is outside 64..=4096");
        }
        let views = Plan {
            infer: crate::infer::InferOptions {
                fov_x: Some(cameras::VIEW_FOV_DEGREES),
                apply_mask: false,
                point_map: true,
                per_step: false,
                ..plan.infer.clone()
            },
            ..plan.clone()
        };
        let pictures = split::split(photo, &cameras::views(), view_size);
        let preds = self.predict_views(pictures, &views)?;
        crate::panorama::from_views(&preds, photo.width() as usize, photo.height() as usize, plan.infer.apply_mask)
    }

    /// Pictures one after another on the model, each prepared on a helper thread while the
    /// one before it runs (a server's take them one by one).
    fn predict_views(&self, pictures: Vec<RgbImage>, plan: &Plan) -> Result<Vec<Prediction>> {
        let Middle::Local(runner) = &self.middle else {
            return pictures.iter().map(|p| self.predict_rgb(p, plan)).collect();
        };
        let model = runner.model();
        std::thread::scope(|s| {
            let (tx, rx) = bounded(1);
            s.spawn(move || {
                for p in &pictures {
                    if tx.send(guarded(|| plan::prepare(model, p, plan))).is_err() {
                        break;
                    }
                }
            });
            rx.iter()
                .map(|placed| {
                    let placed = placed?;
                    guarded(|| {
                        let raw = runner.forward(&placed.prep).context("forward failed")?;
                        Ok(plan::finish(model, &placed, &raw, plan))
                    })
                })
                .collect()
        })
    }

    fn remote(&self, bytes: &[u8], photo: &RgbImage, plan: &Plan) -> Result<Prediction> {
        let Middle::Remote(client) = &self.middle else { unreachable!("remote() on a local model") };
        let r = client.predict(bytes, &remote::remote_request(client, &plan.infer, plan.fit))?;
        remote::check_size(client, &r, (photo.width() as usize, photo.height() as usize))?;
        Ok(r.pred)
    }

    /// Photo files through the pipeline (decode threads, the device worker or the server's
    /// requests in flight, post-processing threads), each prediction or its error handed out in
    /// the order of `paths`. The pipeline runs ahead of the reader by a few photos only, so a
    /// long list keeps memory flat; dropping the iterator stops it.
    pub fn predict_many(&self, paths: Vec<PathBuf>, plan: &Plan) -> Result<Predictions> {
        check(plan)?;
        let engine = match &self.middle {
            Middle::Local(runner) => Engine::Local(runner.model().clone()),
            Middle::Remote(client) => Engine::Remote(client.clone()),
        };
        let mut cfg = Config::new(PathBuf::new());
        cfg.outputs.formats.clear();
        cfg.keep_predictions = true;
        cfg.plan = plan.clone();
        cfg.jobs = self.jobs.max(1);
        let inputs: Vec<_> = paths.iter().map(|p| crate::pipeline::inputs::file_input(p)).collect();
        let stop = Arc::new(AtomicBool::new(false));
        // A few photos beyond the pipeline's own depth: the reader is never starved, and what it
        // has not read yet is bounded.
        let (tx, rx) = bounded(2 * cfg.jobs + 4);
        let worker_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("moge-predict-many".into())
            .spawn(move || {
                crate::pipeline::run::run(engine, inputs, &cfg, &worker_stop, |rec| {
                    let _ = tx.send(rec);
                });
            })
            .context("cannot start the pipeline's thread")?;
        Ok(Predictions { rx: Some(rx), stop, thread: Some(thread), paths, next: 0, waiting: HashMap::new() })
    }
}

/// How a photo file is decoded for `plan`: its field of view read where the plan asks for it.
fn decode_options(plan: &Plan) -> DecodeOptions {
    DecodeOptions { fov: plan.fov, ..Default::default() }
}

fn check(plan: &Plan) -> Result<()> {
    plan.infer.validate().map_err(anyhow::Error::msg)
}

/// The predictions of [`Predictor::predict_many`], in the order of its paths.
pub struct Predictions {
    rx: Option<Receiver<crate::pipeline::record::Record>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    paths: Vec<PathBuf>,
    next: usize,
    /// Records that came before their turn, by index.
    waiting: HashMap<usize, crate::pipeline::record::Record>,
}

impl Predictions {
    /// How many predictions are still to come.
    pub fn remaining(&self) -> usize {
        self.paths.len() - self.next
    }
}

impl Iterator for Predictions {
    type Item = Result<Prediction>;

    fn next(&mut self) -> Option<Result<Prediction>> {
        if self.next >= self.paths.len() {
            return None;
        }
        let i = self.next;
        self.next += 1;
        let rec = loop {
            if let Some(rec) = self.waiting.remove(&i) {
                break Some(rec);
            }
            match self.rx.as_ref().map(|rx| rx.recv()) {
                Some(Ok(rec)) => {
                    self.waiting.insert(rec.index, rec);
                }
                _ => break None,
            }
        };
        Some(match rec {
            Some(crate::pipeline::record::Record { prediction: Some(p), .. }) => Ok(*p),
            Some(crate::pipeline::record::Record { error: Some(e), io_kind: Some(kind), .. }) => Err(std::io::Error::new(kind, e).into()),
            Some(crate::pipeline::record::Record { error: Some(e), .. }) => Err(anyhow::Error::msg(e)),
            Some(_) => Err(anyhow::anyhow!("{}: not predicted", self.paths[i].display())),
            None => Err(anyhow::anyhow!("{}: not predicted: the pipeline stopped", self.paths[i].display())),
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining(), Some(self.remaining()))
    }
}

impl Drop for Predictions {
    /// Stops the pipeline and waits for it: what is on the device finishes, nothing new starts.
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        drop(self.rx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
