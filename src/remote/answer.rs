//! A 2xx answer to `/predict` read back: the npz with its metadata in the `X-MoGe-Meta` header,
//! or JSON with the npz in base64.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::Value;
use ureq::http::HeaderMap;

use super::npz::read_prediction;
use crate::infer::Prediction;

/// The prediction and metadata of a 2xx answer to `/predict`, in either format.
pub(super) fn parse_prediction(body: Vec<u8>, headers: &HeaderMap) -> Result<(Prediction, Value), String> {
    if body.first() == Some(&b'{') {
        let mut meta: serde_json::Map<String, Value> = serde_json::from_slice(&body).map_err(|e| format!("the JSON answer does not parse ({e})"))?;
        drop(body);
        let npz = match meta.remove("outputs") {
            Some(Value::Object(mut o)) => match o.remove("npz") {
                Some(Value::String(s)) => s,
                _ => return Err("the JSON answer has no outputs.npz".into()),
            },
            _ => return Err("the JSON answer has no outputs.npz".into()),
        };
        let npz = BASE64.decode(npz.trim()).map_err(|e| format!("outputs.npz is not base64 ({e})"))?;
        let pred = read_prediction(&npz).map_err(|e| format!("{e:#}"))?;
        return Ok((pred, Value::Object(meta)));
    }
    let meta = headers.get("x-moge-meta").ok_or("the npz answer has no X-MoGe-Meta header")?;
    let meta = serde_json::from_slice(meta.as_bytes()).map_err(|e| format!("the X-MoGe-Meta header is not JSON ({e})"))?;
    let pred = read_prediction(&body).map_err(|e| format!("{e:#}"))?;
    Ok((pred, meta))
}
