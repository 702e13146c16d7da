//! The work of each stage on one photo, free of where the photo comes from and where its
//! outputs go: `moge batch` (files) and `moge serve` (HTTP requests) both call these.

use std::time::Instant;

use anyhow::Result;
use image::RgbImage;

use crate::camera::Pinhole;
use crate::fit::{self, Canvas, FitMode, Placement};
use crate::image_io::FovFrom;
use crate::infer::{InferOptions, Prediction};
use crate::model::v2::Model;
use crate::model::{Prepared, RawOutput};

/// How one photo meets the network.
#[derive(Debug, Clone)]
pub struct Plan {
    pub infer: InferOptions,
    pub fit: FitMode,
    /// The canvas of `pad` and `stretch`.
    pub canvas: Canvas,
    /// Where each photo's own field of view comes from (its EXIF, a camera matrix), beside
    /// `infer.fov_x` for every photo.
    pub fov: FovFrom,
    /// The photo's camera, used whole (set per photo from what `fov` found).
    pub camera: Option<Pinhole>,
}

/// Upstream `infer()`'s options (resolution level 9: not the command line's 1800 tokens), each
/// photo at its own size.
impl Default for Plan {
    fn default() -> Self {
        Plan { infer: InferOptions::default(), fit: FitMode::Exact, canvas: Canvas::FULL_HD, fov: FovFrom::Estimate, camera: None }
    }
}

impl Plan {
    /// This plan for a photo whose EXIF or camera matrix gave its field of view.
    pub fn with_known_fov(&self, fov: Option<&crate::image_io::KnownFov>) -> std::borrow::Cow<'_, Plan> {
        match fov {
            Some(f) => {
                let mut plan = self.clone();
                plan.infer.fov_x = Some(f.degrees);
                plan.camera = f.camera;
                std::borrow::Cow::Owned(plan)
            }
            None => std::borrow::Cow::Borrowed(self),
        }
    }

    /// This plan for an image of `width` x `height` held in memory (no file, so no EXIF): the
    /// camera matrix's field of view applied; `fov` from EXIF refused.
    pub fn for_pixels(&self, width: u32, height: u32) -> Result<std::borrow::Cow<'_, Plan>> {
        match self.fov {
            FovFrom::Estimate => Ok(std::borrow::Cow::Borrowed(self)),
            FovFrom::Exif => anyhow::bail!(
                "the field of view from EXIF needs a photo file, and an image in memory has none: give the file's path, or the field of view in degrees"
            ),
            FovFrom::Intrinsics(_) | FovFrom::Shared(_) => {
                let mut plan = self.with_known_fov(self.fov.of_matrix(width, height).as_ref()).into_owned();
                plan.fov = FovFrom::Estimate;
                Ok(std::borrow::Cow::Owned(plan))
            }
        }
    }

    /// The plan of a request's options (the HTTP API's, which the bindings take too), with their
    /// defaults and checks (1800 tokens unless a resolution level is given; not both), on
    /// `canvas`.
    pub fn from_request(request: &crate::protocol::PredictOptions, canvas: Canvas) -> Result<Plan, String> {
        Ok(Plan { infer: request.infer_options()?, fit: request.fit.unwrap_or(FitMode::Exact), canvas, fov: FovFrom::Estimate, camera: None })
    }
}

/// A photo made ready for the forward, and what is needed to bring the outputs back to it.
#[derive(Debug, Clone)]
pub struct Placed {
    pub photo_size: (usize, usize),
    pub placement: Placement,
    /// The options on the work image (a padded image has a wider field of view).
    pub opts: InferOptions,
    pub prep: Prepared,
    pub prepare_ms: f64,
}

/// Places the photo (`--fit`) and prepares the network input.
pub fn prepare(model: &Model, photo: &RgbImage, plan: &Plan) -> Result<Placed> {
    let t = Instant::now();
    let photo_size = (photo.width() as usize, photo.height() as usize);
    // A known camera other than the model's own is run in its view (see `crate::camera`).
    let (work, placement) = match plan.camera.filter(|k| !k.is_centred(photo.width(), photo.height())) {
        Some(camera) => fit::place_camera(photo, &camera, plan.fit, plan.canvas)?,
        None => fit::place(photo, plan.fit, plan.canvas)?,
    };
    let mut opts = fit::work_options(&plan.infer, placement, photo_size.0);
    // Cropping and resampling back to the photo read the work image's point map and normals.
    opts.point_map |= placement != Placement::Exact;
    opts.normal_map |= placement != Placement::Exact;
    let img = work.as_ref().unwrap_or(photo);
    let tokens = opts.tokens(model.config.num_tokens_range);
    let prep = model.prepare(img.as_raw(), img.width() as usize, img.height() as usize, tokens).refined(model.refine_steps(&opts), opts.per_step);
    Ok(Placed { photo_size, placement, opts, prep, prepare_ms: ms(t) })
}

/// Upstream `infer()`'s post-processing of one forward, at the photo's size.
pub fn finish(model: &Model, s: &Placed, raw: &RawOutput, plan: &Plan) -> Prediction {
    finish_with_fov(model, s, raw, plan, None)
}

/// [`finish`] with the photo's horizontal field of view `fov_x` (degrees) in place of the
/// plan's, where given: the forward does not depend on it, only the focal/shift solve.
pub fn finish_with_fov(model: &Model, s: &Placed, raw: &RawOutput, plan: &Plan, fov_x: Option<f32>) -> Prediction {
    let own;
    let opts = match fov_x {
        Some(fov) => {
            let photo = InferOptions { fov_x: Some(fov), ..plan.infer.clone() };
            own = InferOptions { fov_x: fit::work_options(&photo, s.placement, s.photo_size.0).fov_x, ..s.opts.clone() };
            &own
        }
        None => &s.opts,
    };
    let work = model.postprocess(raw, (s.prep.width, s.prep.height, s.prep.grid), opts);
    fit::restore(work, s.placement, s.photo_size.0, s.photo_size.1, &plan.infer)
}

pub fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
