//! The wire format of `POST /predict` in the HTTP API of the Tenstorrent MoGe-2 server
//! (tt-MoGe), which `moge serve` ([`crate::server`]) answers and `--server` ([`crate::remote`])
//! speaks: one definition for both sides.
//!
//! A request is a JSON object holding the image file in base64 (`"image"`) and the
//! [`PredictOptions`], or the image file itself as the body with the same options in the query
//! string. An option left out takes the default that moge serve and tt-MoGe share, so a client
//! sends only the options that differ from it ([`PredictOptions::from_options`]): a server
//! refuses a field it does not know.

use serde::{Deserialize, Serialize};

pub use crate::fit::FitMode;
pub use crate::outputs::npz::NormalDtype;

use crate::infer::{InferOptions, DEFAULT_NUM_TOKENS};

/// How the answer carries the prediction (`output_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// base64 of the npz inside the JSON.
    #[default]
    Npz,
    /// `depth_png16`, `normal_png`, `mask_png`, base64 inside the JSON.
    Png,
    /// Nested lists (small images only).
    Json,
    /// The npz as the body, the JSON fields in the `X-MoGe-Meta` header.
    NpzBinary,
}

crate::names::names!(OutputFormat, "output_format", { Npz => "npz", Png => "png", Json => "json", NpzBinary => "npz_binary" });

/// The element type of the npz normal a server sends when none is asked for (tt-MoGe's layout).
pub const DEFAULT_NORMAL_DTYPE: NormalDtype = NormalDtype::Float16;

/// The options of one prediction; `None` is the server's default, and is not sent. Unknown
/// names are refused, so that a misspelt option is an error instead of being ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictOptions {
    /// Default [`OutputFormat::Npz`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_format: Option<OutputFormat>,
    /// How the photo meets the server's canvas; default [`FitMode::Exact`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit: Option<FitMode>,
    /// Known horizontal field of view, degrees.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fov_x: Option<f32>,
    /// Default true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub apply_mask: Option<bool>,
    /// Default true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub force_projection: Option<bool>,
    /// A 16-bit depth PNG beside the npz; default false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub include_depth_png: Option<bool>,
    /// Default [`DEFAULT_NUM_TOKENS`] unless `resolution_level` is given (not both).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_tokens: Option<u32>,
    /// Upstream's resolution level; default 9 where it applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolution_level: Option<u32>,
    /// Default [`DEFAULT_NORMAL_DTYPE`]; `float32` asks for the normals as computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub npz_normal_dtype: Option<NormalDtype>,
    /// MoGe-3's refine steps; default the model's (3 for MoGe-3; a MoGe-2 model refuses any
    /// other than 0). A moge extension: tt-MoGe runs MoGe-2 and does not know it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refine_steps: Option<u32>,
}

impl PredictOptions {
    /// The options of `opts` that differ from upstream `infer()`'s defaults, which servers
    /// share. `num_tokens` is kept when set, as it decides over `resolution_level`.
    pub fn from_options(opts: &InferOptions) -> PredictOptions {
        let d = InferOptions::default();
        PredictOptions {
            fov_x: opts.fov_x,
            apply_mask: (opts.apply_mask != d.apply_mask).then_some(opts.apply_mask),
            force_projection: (opts.force_projection != d.force_projection).then_some(opts.force_projection),
            num_tokens: opts.num_tokens,
            resolution_level: (opts.num_tokens.is_none() && opts.resolution_level != d.resolution_level).then_some(opts.resolution_level),
            refine_steps: opts.refine_steps,
            ..Default::default()
        }
    }

    /// The `infer()` options a server runs with: the defaults where unset, every range checked
    /// ([`InferOptions::validate`]); `num_tokens` and `resolution_level` together are refused.
    pub fn infer_options(&self) -> Result<InferOptions, String> {
        if self.num_tokens.is_some() && self.resolution_level.is_some() {
            return Err("give num_tokens or resolution_level, not both".into());
        }
        let d = InferOptions::default();
        let infer = InferOptions {
            num_tokens: if self.resolution_level.is_some() { None } else { Some(self.num_tokens.unwrap_or(DEFAULT_NUM_TOKENS)) },
            resolution_level: self.resolution_level.unwrap_or(d.resolution_level),
            fov_x: self.fov_x,
            force_projection: self.force_projection.unwrap_or(d.force_projection),
            apply_mask: self.apply_mask.unwrap_or(d.apply_mask),
            refine_steps: self.refine_steps,
            ..d
        };
        infer.validate()?;
        Ok(infer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_options_are_not_sent() {
        assert_eq!(serde_json::to_string(&PredictOptions::default()).unwrap(), "{}");
        let o = PredictOptions {
            output_format: Some(OutputFormat::NpzBinary),
            fit: Some(FitMode::Stretch),
            fov_x: Some(60.0),
            npz_normal_dtype: Some(NormalDtype::Float32),
            ..Default::default()
        };
        let text = serde_json::to_string(&o).unwrap();
        assert_eq!(text, r#"{"output_format":"npz_binary","fit":"stretch","fov_x":60.0,"npz_normal_dtype":"float32"}"#);
        assert_eq!(serde_json::from_str::<PredictOptions>(&text).unwrap(), o);
        assert_eq!(serde_urlencoded::from_str::<PredictOptions>("fit=pad&npz_normal_dtype=float16").unwrap().fit, Some(FitMode::Pad));
    }

    #[test]
    fn defaults_are_upstream_infer_with_the_shared_token_count() {
        let infer = PredictOptions::default().infer_options().unwrap();
        assert_eq!(infer, InferOptions { num_tokens: Some(DEFAULT_NUM_TOKENS), ..Default::default() });
        let level = PredictOptions { resolution_level: Some(3), ..Default::default() }.infer_options().unwrap();
        assert_eq!((level.num_tokens, level.resolution_level), (None, 3));
        let both = PredictOptions { resolution_level: Some(3), num_tokens: Some(1200), ..Default::default() };
        assert!(both.infer_options().unwrap_err().contains("not both"));
    }
}
