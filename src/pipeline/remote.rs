//! A MoGe-2 HTTP server as the middle stage (`--server`): photos are decoded here (a damaged
//! one fails here with its reason, and ply / glb take their colours from it), sent several at
//! a time, and the answers written here.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use super::backend::{Backend, Finished, Staged};
use super::inputs::Input;
use super::plan::{ms, Plan};
use crate::fit::{FitMode, Placement};
use crate::image_io::DecodeOptions;
use crate::infer::InferOptions;
use crate::protocol::PredictOptions;
use crate::remote::{Client, RemoteError, Response};

pub struct RemoteBackend {
    client: Arc<Client>,
    request: PredictOptions,
    infer: InferOptions,
    in_flight: usize,
}

impl RemoteBackend {
    /// `in_flight` requests at once, each with the options of `infer` and `fit`.
    pub fn new(client: Arc<Client>, infer: &InferOptions, fit: FitMode, in_flight: usize) -> Self {
        let request = remote_request(&client, infer, fit);
        Self { client, request, infer: infer.clone(), in_flight: in_flight.max(1) }
    }
}

/// The options sent with each photo to `client`: only those that differ from the defaults that
/// moge serve and tt-MoGe share, since a server may refuse a field it does not know.
pub fn remote_request(client: &Client, infer: &InferOptions, fit: FitMode) -> PredictOptions {
    let mut r = PredictOptions::from_options(infer);
    if r.num_tokens == Some(crate::infer::DEFAULT_NUM_TOKENS) {
        r.num_tokens = None;
    }
    r.fit = (fit != FitMode::Exact).then_some(fit);
    r.npz_normal_dtype = client.normal_dtype();
    r
}

/// The answer's maps must be the photo's size.
pub fn check_size(client: &Client, r: &Response, photo_size: (usize, usize)) -> Result<()> {
    if (r.pred.width, r.pred.height) != photo_size {
        anyhow::bail!("the server at {} answered with {}x{} maps for a {}x{} photo", client.url(), r.pred.width, r.pred.height, photo_size.0, photo_size.1);
    }
    Ok(())
}

/// A photo to send: its file, and the field of view its EXIF gave (`--fov-x exif`).
pub struct Upload {
    pub bytes: Vec<u8>,
    pub fov_x: Option<f32>,
    /// The view of a known camera that is sent instead of the photo, and the photo's size:
    /// the answer is brought back to the photo here (see `crate::camera`).
    pub view: Option<(Placement, (usize, usize))>,
}

impl Upload {
    /// The server's answer for this upload at the photo's pixels and camera.
    pub fn restore(&self, mut r: Response, infer: &InferOptions) -> Response {
        if let Some((placement, (w, h))) = self.view {
            if let Placement::Camera(v) = placement {
                if (r.pred.width, r.pred.height) != (v.width, v.height) {
                    return r; // the size check of `finish` names the server
                }
            }
            r.pred = crate::fit::restore(r.pred, placement, w, h, infer);
        }
        r
    }

    /// The options sent with this photo: `request`, with the photo's own field of view.
    pub fn options<'a>(&self, request: &'a PredictOptions) -> std::borrow::Cow<'a, PredictOptions> {
        match self.fov_x {
            Some(fov) => std::borrow::Cow::Owned(PredictOptions { fov_x: Some(fov), ..request.clone() }),
            None => std::borrow::Cow::Borrowed(request),
        }
    }
}

/// On a decode thread: the photo read here (a damaged one fails here, with its reason) and the
/// file to send for it.
pub fn stage(input: &Input, decode: &DecodeOptions, fit: FitMode, canvas: crate::fit::Canvas) -> Result<Staged<Upload>> {
    let t = Instant::now();
    let (d, file) = match input.frame {
        Some(_) => (input.decode(decode)?, None),
        None => {
            let l = crate::image_io::load_with_source(&input.path, &input.decode_options(decode))?;
            (l.decoded, Some((l.bytes, l.source)))
        }
    };
    let decode_ms = ms(t);
    let t = Instant::now();
    let mut fov_x = d.known_fov.as_ref().map(|f| f.degrees);
    // A known camera other than the model's own: its view goes, as a PNG.
    let camera = d.known_fov.as_ref().and_then(|f| f.camera).filter(|k| !k.is_centred(d.image.width(), d.image.height()));
    let (view, fit_view) = match camera {
        Some(k) => {
            let (work, placement) = crate::fit::place_camera(&d.image, &k, fit, canvas).with_context(|| input.name())?;
            if let Placement::Camera(view) = placement {
                fov_x = Some(view.fov_x());
            }
            (work, Some((placement, (d.image.width() as usize, d.image.height() as usize))))
        }
        None => (None, None),
    };
    // A file goes as it is where the server would decode it alike; a video's frame as a PNG.
    let send = match (&file, &view) {
        (_, Some(v)) => crate::remote::png_for_server(v),
        (Some((bytes, source)), None) => crate::remote::image_for_server(bytes, source, &d.image).map(|c| c.into_owned()),
        (None, None) => crate::remote::png_for_server(&d.image),
    }
    .with_context(|| format!("{}: cannot encode the photo for the server", input.name()))?;
    let job = Upload { bytes: send, fov_x, view: fit_view };
    Ok(Staged { photo: d.image, warning: d.warning, known_fov: d.known_fov, exif_unreadable: d.exif_unreadable, job, decode_ms, prepare_ms: ms(t) })
}

/// `client`'s answer `r` for a photo of `photo_size`, and what the sidecar says of the server.
pub fn finish(client: &Client, r: Response, photo_size: (usize, usize), plan: &Plan) -> Result<Finished> {
    check_size(client, &r, photo_size)?;
    let num_tokens = r.meta.get("num_tokens").and_then(|v| v.as_u64()).map(|n| n as u32).unwrap_or_else(|| plan.infer.num_tokens.unwrap_or(0));
    let grid = r.meta.get("grid").and_then(|g| Some((g.get(0)?.as_u64()? as usize, g.get(1)?.as_u64()? as usize))).unwrap_or(r.pred.grid);
    let server = serde_json::json!({
        "url": client.url(),
        "model": client.model(),
        "device": client.device(),
        "attempts": r.attempts,
        "timing_ms": r.meta.get("timing_ms"),
    });
    Ok(Finished { pred: r.pred, device: format!("remote {}", client.device().unwrap_or("device")), num_tokens, grid, server: Some(server) })
}

/// The weights' digest as `client`'s server gives it.
pub fn weights_digest(client: &Client) -> String {
    client.info().get("weights_sha256").and_then(|v| v.as_str()).unwrap_or("unavailable: not given by the server").to_owned()
}

impl Backend for RemoteBackend {
    type Job = Upload;
    type Answer = Response;

    fn lanes(&self) -> usize {
        self.in_flight
    }

    fn queue(&self) -> usize {
        self.in_flight
    }

    fn stage(&self, input: &Input, plan: &Plan, decode: &DecodeOptions) -> Result<Staged<Upload>> {
        stage(input, decode, plan.fit, plan.canvas)
    }

    fn forward(&self, upload: Upload) -> Result<Response> {
        let r = self.client.predict(&upload.bytes, &upload.options(&self.request))?;
        Ok(upload.restore(r, &self.infer))
    }

    /// A server that cannot be reached fails every later photo too.
    fn is_fatal(&self, err: &anyhow::Error) -> bool {
        err.downcast_ref::<RemoteError>().is_some_and(RemoteError::is_unreachable)
    }

    fn finish(&self, r: Response, photo_size: (usize, usize), plan: &Plan) -> Result<Finished> {
        finish(&self.client, r, photo_size, plan)
    }

    fn metric_scale(&self, r: &Response) -> Option<f32> {
        Some(r.pred.metric_scale)
    }

    fn has_normal(&self) -> bool {
        self.client.has_normal()
    }

    fn model_id(&self, configured: &str) -> String {
        self.client.model().map(str::to_owned).unwrap_or_else(|| configured.to_owned())
    }

    fn weights_digest(&self, _weights: &Path) -> String {
        weights_digest(&self.client)
    }
}
