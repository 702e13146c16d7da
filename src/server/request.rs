//! What a `POST /predict` asks for: the Tenstorrent MoGe-2 server's (tt-MoGe) JSON body with a
//! base64 image, or the image itself as the body with the same options in the query string.

use base64::Engine;
use serde::Deserialize;

use super::ApiError;
use crate::infer::InferOptions;
use crate::outputs::npz::NormalDtype;
use crate::pipeline::fit::FitMode;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// base64 of the npz inside the JSON.
    #[default]
    Npz,
    /// `depth_png16`, `normal_png`, `mask_png`, base64 inside the JSON.
    Png,
    /// Nested lists (small images only).
    Json,
    /// The npz as the body, the JSON fields in `X-MoGe-Meta`.
    NpzBinary,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fit {
    Exact,
    Pad,
    Stretch,
}

/// Every option; unset ones take the server's defaults. Unknown names are refused, so that a
/// misspelt option is an error instead of being ignored.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    pub output_format: Option<OutputFormat>,
    pub fit: Option<Fit>,
    pub fov_x: Option<f32>,
    pub apply_mask: Option<bool>,
    pub force_projection: Option<bool>,
    pub include_depth_png: Option<bool>,
    pub num_tokens: Option<u32>,
    pub resolution_level: Option<u32>,
    /// `float16` (the tt-MoGe layout, the default here) or `float32`.
    pub npz_normal_dtype: Option<NormalDtypeName>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormalDtypeName {
    Float16,
    Float32,
}

/// A request, parsed and checked.
#[derive(Debug)]
pub struct Request {
    pub image: Vec<u8>,
    pub format: OutputFormat,
    pub fit: FitMode,
    pub infer: InferOptions,
    pub include_depth_png: bool,
    pub normal_dtype: NormalDtype,
}

/// The body is JSON when it says so, or when it starts with `{` (`curl -d @req.json` sends
/// no JSON content type); anything else is the image itself.
pub fn parse(content_type: Option<&str>, query: Option<&str>, body: &[u8], max_tokens: u32) -> Result<Request, ApiError> {
    let is_json = content_type.is_some_and(|c| c.trim_start().starts_with("application/json")) || body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let (image, opts) = if is_json {
        if query.is_some_and(|q| !q.is_empty()) {
            return Err(ApiError::bad_request("options go in the JSON body when the image does (the query string is for a raw image body)"));
        }
        let mut v: serde_json::Value = serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
        let obj = v.as_object_mut().ok_or_else(|| ApiError::bad_request("the JSON body must be an object"))?;
        let image = match obj.remove("image") {
            Some(serde_json::Value::String(s)) => decode_base64(&s)?,
            Some(_) => return Err(ApiError::bad_request("\"image\" must be a base64 string")),
            None => return Err(ApiError::bad_request("missing \"image\" (base64 of a PNG or JPEG file)")),
        };
        let opts: Options = serde_json::from_value(v).map_err(|e| ApiError::bad_request(format!("bad option: {e}")))?;
        (image, opts)
    } else {
        if body.is_empty() {
            return Err(ApiError::bad_request("empty body: send JSON {\"image\": base64} or the image file itself"));
        }
        let opts: Options =
            serde_urlencoded::from_str(query.unwrap_or("")).map_err(|e| ApiError::bad_request(format!("bad option in the query string: {e}")))?;
        (body.to_vec(), opts)
    };
    build(image, opts, max_tokens)
}

fn decode_base64(s: &str) -> Result<Vec<u8>, ApiError> {
    // A data URL's prefix (`data:image/png;base64,`) is accepted too.
    let s = match s.find(";base64,") {
        Some(i) if s.starts_with("data:") => &s[i + 8..],
        _ => s,
    };
    let s: String = s.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(s.as_bytes()).map_err(|e| ApiError::bad_request(format!("\"image\" is not valid base64: {e}")))
}

fn build(image: Vec<u8>, o: Options, max_tokens: u32) -> Result<Request, ApiError> {
    let infer = InferOptions {
        num_tokens: if o.resolution_level.is_some() { None } else { Some(o.num_tokens.unwrap_or(crate::infer::DEFAULT_NUM_TOKENS)) },
        resolution_level: o.resolution_level.unwrap_or(9),
        fov_x: o.fov_x,
        force_projection: o.force_projection.unwrap_or(true),
        apply_mask: o.apply_mask.unwrap_or(true),
        point_map: true,
        normal_map: true,
    };
    if o.num_tokens.is_some() && o.resolution_level.is_some() {
        return Err(ApiError::bad_request("give num_tokens or resolution_level, not both"));
    }
    infer.validate().map_err(ApiError::bad_request)?;
    if let Some(n) = infer.num_tokens.filter(|&n| n > max_tokens) {
        return Err(ApiError::bad_request(format!("num_tokens {n} is over this server's limit of {max_tokens} (moge serve --max-tokens)")));
    }
    Ok(Request {
        image,
        format: o.output_format.unwrap_or_default(),
        fit: match o.fit.unwrap_or(Fit::Exact) {
            Fit::Exact => FitMode::Exact,
            Fit::Pad => FitMode::Pad,
            Fit::Stretch => FitMode::Stretch,
        },
        infer,
        include_depth_png: o.include_depth_png.unwrap_or(false),
        normal_dtype: match o.npz_normal_dtype.unwrap_or(NormalDtypeName::Float16) {
            NormalDtypeName::Float16 => NormalDtype::Float16,
            NormalDtypeName::Float32 => NormalDtype::Float32,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(b: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(b)
    }

    #[test]
    fn json_body_with_options() {
        let body =
            format!(r#"{{"image": "{}", "output_format": "png", "fit": "pad", "fov_x": 60, "apply_mask": false, "include_depth_png": true}}"#, b64(b"abc"));
        let r = parse(None, None, body.as_bytes(), 10_000).unwrap();
        assert_eq!(r.image, b"abc");
        assert_eq!(r.format, OutputFormat::Png);
        assert_eq!(r.fit, FitMode::Pad);
        assert_eq!(r.infer.fov_x, Some(60.0));
        assert!(!r.infer.apply_mask && r.infer.force_projection && r.include_depth_png);
        assert_eq!(r.normal_dtype, NormalDtype::Float16);
    }

    #[test]
    fn raw_body_with_query() {
        let r = parse(Some("image/jpeg"), Some("output_format=npz_binary&num_tokens=1200&npz_normal_dtype=float32"), b"\xff\xd8", 10_000).unwrap();
        assert_eq!(r.image, b"\xff\xd8");
        assert_eq!(r.format, OutputFormat::NpzBinary);
        assert_eq!(r.infer.num_tokens, Some(1200));
        assert_eq!(r.normal_dtype, NormalDtype::Float32);
        assert_eq!(r.fit, FitMode::Exact);
    }

    #[test]
    fn refusals_name_the_problem() {
        let bad = |ct: Option<&str>, q: Option<&str>, body: &str, needle: &str| {
            let e = parse(ct, q, body.as_bytes(), 3000).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{body}");
            assert!(e.message.contains(needle), "{:?} lacks {needle:?}", e.message);
        };
        bad(None, None, r#"{"output_format": "npz"}"#, "missing \"image\"");
        bad(None, None, r#"{"image": "***"}"#, "not valid base64");
        bad(None, None, &format!(r#"{{"image": "{}", "output_format": "tiff"}}"#, b64(b"x")), "tiff");
        bad(None, None, &format!(r#"{{"image": "{}", "fov": 60}}"#, b64(b"x")), "fov");
        bad(None, None, &format!(r#"{{"image": "{}", "fov_x": 200}}"#, b64(b"x")), "field of view");
        bad(None, None, &format!(r#"{{"image": "{}", "num_tokens": 5000}}"#, b64(b"x")), "limit of 3000");
        bad(None, None, "{not json", "not valid JSON");
        bad(Some("image/png"), Some("fit=sideways"), "PNG", "sideways");
        bad(Some("image/png"), None, "", "empty body");
    }
}
