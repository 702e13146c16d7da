//! Why a request to a server failed, in words that name the server and the reason.

use std::time::Duration;

use serde_json::Value;

/// Why a request failed. Every message names the URL and the reason.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// No connection, or the connection dropped with no answer, on every attempt: the server
    /// is down, and a batch cannot go on.
    #[error("cannot reach the server at {url}: {reason}{}", after(*attempts))]
    Unreachable { url: String, reason: String, attempts: u32 },
    /// A 4xx: the server refused this request (the image or an option), so it is not retried
    /// (except 408 and 429, which end here when the retries are spent).
    #[error("the server at {url} refused the request ({}): {message}", status_text(*status))]
    Rejected { url: String, status: u16, message: String },
    /// A 5xx on every attempt.
    #[error("the server at {url} failed with {}{}: {message}", status_text(*status), after(*attempts))]
    Server { url: String, status: u16, message: String, attempts: u32 },
    /// No whole answer within [`ClientOptions::timeout`](super::ClientOptions::timeout) on every attempt.
    #[error("no answer from the server at {url} within {:.1} s{}", limit.as_secs_f64(), after(*attempts))]
    Timeout { url: String, limit: Duration, attempts: u32 },
    /// An answer that is not what the API says (a damaged npz, missing metadata, bad JSON).
    #[error("bad answer from the server at {url}: {message}")]
    Protocol { url: String, message: String },
}

impl RemoteError {
    /// The server cannot be reached: fatal for a whole batch, not one photo's failure.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, RemoteError::Unreachable { .. })
    }
}

fn after(attempts: u32) -> String {
    if attempts > 1 {
        format!(" (after {attempts} attempts)")
    } else {
        String::new()
    }
}

pub(super) fn status_text(status: u16) -> String {
    match ureq::http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()) {
        Some(reason) => format!("{status} {reason}"),
        None => status.to_string(),
    }
}

/// The server's words in an error body: `{"error": ...}` (moge serve), `{"detail": ...}`
/// (FastAPI, a string or a list of validation errors), or the text itself.
pub(super) fn error_message(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let from_json = serde_json::from_str::<Value>(text).ok().and_then(|v| {
        let m = v.get("error").or_else(|| v.get("detail")).or_else(|| v.get("message"))?;
        Some(match m {
            Value::String(s) => s.clone(),
            Value::Array(items) => items
                .iter()
                .map(|i| match (i.get("loc"), i.get("msg").and_then(Value::as_str)) {
                    (Some(Value::Array(loc)), Some(msg)) => {
                        let loc: Vec<String> = loc.iter().map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_owned)).collect();
                        format!("{}: {msg}", loc.join("."))
                    }
                    (_, Some(msg)) => msg.to_owned(),
                    _ => i.to_string(),
                })
                .collect::<Vec<_>>()
                .join("; "),
            other => other.to_string(),
        })
    });
    let message = from_json.unwrap_or_else(|| text.to_owned());
    if message.is_empty() {
        return "(no message)".into();
    }
    // A proxy's HTML page or a stack trace: the start says enough.
    match message.char_indices().nth(500) {
        Some((i, _)) => format!("{}...", &message[..i]),
        None => message,
    }
}
