//! The answer to `POST /predict`, field for field as the Tenstorrent MoGe-2 server (tt-MoGe)
//! gives it: the summary fields, then `outputs` in the format asked for.

use std::io::Cursor;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Serialize;

use super::request::Request;
use super::ApiError;
use crate::infer::Prediction;
use crate::outputs::json::DepthStats;
use crate::outputs::npz::{self, Compression};
use crate::outputs::png;
use crate::protocol::OutputFormat;

/// The largest image (in pixels) whose maps are sent as nested JSON lists, as tt-MoGe.
pub const JSON_MAX_PIXELS: usize = 512 * 512;

/// Milliseconds per step of one request.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timing {
    pub decode: f64,
    pub prepare: f64,
    /// Waiting for the device worker.
    pub queue: f64,
    /// The forward.
    pub device: f64,
    pub postprocess: f64,
    pub encode: f64,
    /// From the request's arrival to the response (the body read included).
    pub total: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DepthRange {
    pub min: Option<f32>,
    pub median: Option<f32>,
    pub max: Option<f32>,
}

/// Everything but the maps: the JSON response without `outputs`, and `X-MoGe-Meta`.
#[derive(Debug, Clone, Serialize)]
pub struct Meta {
    pub height: usize,
    pub width: usize,
    pub metric_scale: f32,
    pub fov_x_deg: f32,
    pub fov_y_deg: f32,
    pub mask_coverage: f64,
    pub intrinsics: [[f32; 3]; 3],
    pub intrinsics_pixels: [[f32; 3]; 3],
    pub depth_m: DepthRange,
    pub num_tokens: u32,
    pub grid: (usize, usize),
    pub fit: &'static str,
    pub timing_ms: Timing,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Encoding {
    /// Metres per unit of `depth_png16` (0 = invalid).
    pub depth_png_scale: f32,
    /// Valid depths clamped to the 16-bit range.
    pub depth_png_saturated: usize,
}

impl Meta {
    pub fn new(p: &Prediction, stats: &DepthStats, num_tokens: u32, fit: &'static str, warning: Option<String>) -> Self {
        let (fx, fy) = p.fov_degrees();
        Meta {
            height: p.height,
            width: p.width,
            metric_scale: p.metric_scale,
            fov_x_deg: fx,
            fov_y_deg: fy,
            mask_coverage: p.valid_fraction(),
            intrinsics: p.intrinsics,
            intrinsics_pixels: p.intrinsics_pixels(),
            depth_m: DepthRange { min: stats.min, median: stats.median, max: stats.max },
            num_tokens,
            grid: p.grid,
            fit,
            timing_ms: Timing::default(),
            encoding: None,
            warning,
        }
    }
}

/// The maps of `format`; completes `meta.encoding` for PNGs. JSON lists of larger images are
/// refused before the forward (see `super::predict`).
pub enum Body {
    /// The fields of `outputs`, each already JSON text (floats keep their f32 digits).
    Json(Vec<(&'static str, String)>),
    Npz(Vec<u8>),
}

pub fn encode(p: &Prediction, req: &Request, meta: &mut Meta, depth_png_scale: f32, compression: Compression) -> Result<Body, ApiError> {
    let b64 = |b: &[u8]| format!("\"{}\"", base64::engine::general_purpose::STANDARD.encode(b));
    let internal = |e: anyhow::Error| ApiError::internal(format!("cannot encode the outputs: {e:#}"));
    let npz_bytes = || -> Result<Vec<u8>, ApiError> {
        let out = npz::encode(Cursor::new(Vec::with_capacity(npz_size(p, req))), p, compression, req.normal_dtype).map_err(internal)?;
        Ok(out.into_inner())
    };
    let mut outputs = Vec::new();
    let depth_png = |outputs: &mut Vec<(&'static str, String)>, meta: &mut Meta| -> Result<(), ApiError> {
        let (bytes, saturated) = png::depth_png(p, depth_png_scale).map_err(internal)?;
        outputs.push(("depth_png16", b64(&bytes)));
        meta.encoding = Some(Encoding { depth_png_scale, depth_png_saturated: saturated });
        Ok(())
    };
    match req.format {
        OutputFormat::NpzBinary => return Ok(Body::Npz(npz_bytes()?)),
        OutputFormat::Npz => {
            outputs.push(("npz", b64(&npz_bytes()?)));
            if req.include_depth_png {
                depth_png(&mut outputs, meta)?;
            }
        }
        OutputFormat::Png => {
            depth_png(&mut outputs, meta)?;
            if p.normal.is_some() {
                outputs.push(("normal_png", b64(&png::normal_png(p).map_err(internal)?)));
            }
            outputs.push(("mask_png", b64(&png::mask_png(p).map_err(internal)?)));
        }
        OutputFormat::Json => {
            // Non-finite values (the inf of invalid pixels) have no JSON form: null.
            outputs.push(("points", json(&rows3(&p.points, p.width))?));
            outputs.push(("depth", json(&p.depth.chunks(p.width).collect::<Vec<_>>())?));
            if let Some(n) = &p.normal {
                outputs.push(("normal", json(&rows3(n, p.width))?));
            }
            let mask: Vec<u8> = p.mask.iter().map(|&m| m as u8).collect();
            outputs.push(("mask", json(&mask.chunks(p.width).collect::<Vec<_>>())?));
            if req.include_depth_png {
                depth_png(&mut outputs, meta)?;
            }
        }
    }
    Ok(Body::Json(outputs))
}

/// (H, W, 3) as rows of pixels of 3 values.
fn rows3(v: &[f32], width: usize) -> Vec<Vec<&[f32]>> {
    v.chunks(3 * width).map(|r| r.chunks(3).collect()).collect()
}

fn json<T: Serialize + ?Sized>(v: &T) -> Result<String, ApiError> {
    serde_json::to_string(v).map_err(|e| ApiError::internal(format!("cannot encode the outputs: {e}")))
}

fn npz_size(p: &Prediction, req: &Request) -> usize {
    let px = p.width * p.height;
    px * (12 + 4 + 1) + if p.normal.is_some() { px * if req.normal_dtype == npz::NormalDtype::Float16 { 6 } else { 12 } } else { 0 } + 4096
}

/// The HTTP response of a finished request.
pub fn respond(meta: &Meta, body: Body) -> Response {
    match body {
        Body::Npz(bytes) => {
            let mut r = (StatusCode::OK, bytes).into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-npz"));
            // A header value is visible ASCII: anything else in the JSON goes as \u escapes.
            let text = ascii_json(&serde_json::to_string(meta).unwrap_or_default());
            if let Ok(v) = HeaderValue::from_str(&text) {
                r.headers_mut().insert("x-moge-meta", v);
            }
            r
        }
        Body::Json(outputs) => {
            // The meta object with `outputs` appended before its closing brace.
            let mut text = serde_json::to_string(meta).unwrap_or_else(|_| "{}".into());
            text.pop();
            text.push_str(if text.len() > 1 { ",\"outputs\":{" } else { "\"outputs\":{" });
            for (i, (name, value)) in outputs.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                text.push_str(&format!("\"{name}\":"));
                text.push_str(value);
            }
            text.push_str("}}");
            let mut r = (StatusCode::OK, text).into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
    }
}

/// Compact JSON with every non-ASCII or control character escaped.
pub fn ascii_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() && !c.is_ascii_control() {
            out.push(c);
        } else {
            let mut buf = [0u16; 2];
            for u in c.encode_utf16(&mut buf) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::{json, Value};

    #[test]
    fn meta_header_is_ascii_and_the_same_json() {
        let v = json!({"warning": "ünïcode\tand \"quotes\"", "n": 1.5});
        let s = ascii_json(&v.to_string());
        assert!(s.bytes().all(|b| (0x20..0x7f).contains(&b)), "{s}");
        assert_eq!(serde_json::from_str::<Value>(&s).unwrap(), v);
    }
}
