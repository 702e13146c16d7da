//! What a `POST /predict` asks for: the JSON body of the Tenstorrent MoGe-2 server (tt-MoGe) with
//! a base64 image, or the image itself as the body with the same options in the query string.

use base64::Engine;

use super::ApiError;
use crate::infer::InferOptions;
use crate::protocol::{FitMode, NormalDtype, OutputFormat, PredictOptions, DEFAULT_NORMAL_DTYPE};

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
        let opts: PredictOptions = serde_json::from_value(v).map_err(|e| ApiError::bad_request(format!("bad option: {e}")))?;
        (image, opts)
    } else {
        if body.is_empty() {
            return Err(ApiError::bad_request("empty body: send JSON {\"image\": base64} or the image file itself"));
        }
        let opts: PredictOptions =
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

fn build(image: Vec<u8>, o: PredictOptions, max_tokens: u32) -> Result<Request, ApiError> {
    let infer = o.infer_options().map_err(ApiError::bad_request)?;
    if let Some(n) = infer.num_tokens.filter(|&n| n > max_tokens) {
        return Err(ApiError::bad_request(format!("num_tokens {n} is over this server's limit of {max_tokens} (moge serve --max-tokens)")));
    }
    Ok(Request {
        image,
        format: o.output_format.unwrap_or_default(),
        fit: o.fit.unwrap_or(FitMode::Exact),
        infer,
        include_depth_png: o.include_depth_png.unwrap_or(false),
        normal_dtype: o.npz_normal_dtype.unwrap_or(DEFAULT_NORMAL_DTYPE),
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
