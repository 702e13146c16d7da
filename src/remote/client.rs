//! The client of one server: connection, requests with their retries and backoff, the answer
//! in either format.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde::Serialize;
use serde_json::Value;

use super::answer::parse_prediction;
use super::error::{error_message, status_text, RemoteError};
use super::slots::Slots;
use crate::infer::Prediction;
use crate::protocol::{NormalDtype, OutputFormat, PredictOptions};

/// The longest wait between two attempts that the client chooses itself, and the longest
/// `Retry-After` it honours.
const MAX_BACKOFF: Duration = Duration::from_secs(8);
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
/// The most memory reserved up front for an answer of a declared length.
const PREALLOCATE_MAX: u64 = 256 << 20;
/// Error bodies are messages: what is read of one.
const MAX_ERROR_BODY: u64 = 1 << 20;

/// How the client talks to the server.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Longest time for one attempt of one request, the answer's body included.
    pub timeout: Duration,
    /// Attempts after the first, for failures that may pass: no connection, a timeout, a
    /// 500/502/503/504, 408 or 429.
    pub retries: u32,
    /// Most requests this client has open at once; callers beyond it wait for a turn.
    pub in_flight: usize,
    /// The wait before the first retry, doubled at each next one (up to 8 s), unless the
    /// server says how long in `Retry-After` (honoured up to 30 s).
    pub backoff: Duration,
    /// Largest answer accepted. float32 maps of a 12-megapixel photo are ~350 MB as npz, a
    /// third more in base64.
    pub max_response_bytes: u64,
    /// Whether a prediction that got no answer (no connection, or none within `timeout`) is
    /// tried again here. A pool of servers sends it to another server at once instead.
    pub retry_no_answer: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            retries: 3,
            in_flight: 4,
            backoff: Duration::from_millis(250),
            max_response_bytes: 2 << 30,
            retry_no_answer: true,
        }
    }
}

/// A prediction from the server.
#[derive(Debug, Clone)]
pub struct Response {
    /// `focal`, `shift` and `grid` are not known from the server (see [`read_prediction`](super::read_prediction)).
    pub pred: Prediction,
    /// The server's metadata (size, fov, depth statistics, timings, ...), without the npz.
    pub meta: Value,
    /// `timing_ms.device` and `timing_ms.total` of the metadata.
    pub device_ms: Option<f64>,
    pub total_ms: Option<f64>,
    /// HTTP requests made for this prediction, retries and the format fallback included.
    pub attempts: u32,
}

/// Which failures to get an answer [`Client::call`] tries again (5xx, 408 and 429 always, while
/// its retries last), and a shorter limit for each attempt than the client's own.
#[derive(Clone, Copy)]
struct Again {
    unreachable: bool,
    timeout: bool,
    limit: Option<Duration>,
}

impl Again {
    const NEVER: Again = Again { unreachable: false, timeout: false, limit: None };
}

/// The longest each request of a probe ([`Client::probe`]) waits.
const PROBE_LIMIT: Duration = Duration::from_secs(5);

/// Which answer format the server is known to give.
const FORMAT_UNKNOWN: u8 = 0;
const FORMAT_BINARY: u8 = 1;
const FORMAT_JSON: u8 = 2;

/// A connection to one server, shared by reference across threads.
pub struct Client {
    base: String,
    agent: ureq::Agent,
    opts: ClientOptions,
    info: Value,
    format: AtomicU8,
    slots: Slots,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("url", &self.base).field("info", &self.info).finish_non_exhaustive()
    }
}

/// One HTTP answer, of any status.
struct Reply {
    status: u16,
    headers: ureq::http::HeaderMap,
    body: Vec<u8>,
}

/// Why one attempt got no answer.
enum NoAnswer {
    Unreachable(String),
    Timeout,
    Protocol(String),
}

impl Client {
    /// Checks that the server answers `/health`, then reads `/info` (kept as [`Value::Null`]
    /// where the server has none). `url` is `http://host:port`, `https://...` or `host:port`,
    /// with or without a path prefix and trailing slash.
    pub fn connect(url: &str, opts: ClientOptions) -> Result<Client> {
        let retries = opts.retries;
        Self::connect_with(url, opts, retries, Again { unreachable: false, timeout: true, limit: None })
    }

    /// [`Client::connect`] for a probe: `/health` and `/info` asked once each, within 5 s each;
    /// the predictions then as `opts` says.
    pub fn probe(url: &str, opts: ClientOptions) -> Result<Client> {
        Self::connect_with(url, opts, 0, Again { limit: Some(PROBE_LIMIT), ..Again::NEVER })
    }

    fn connect_with(url: &str, opts: ClientOptions, retries: u32, again: Again) -> Result<Client> {
        let base = normalise_url(url)?;
        let agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(opts.timeout))
                .timeout_connect(Some(opts.timeout.min(Duration::from_secs(10))))
                .max_redirects(0)
                .max_redirects_will_error(false)
                .max_idle_connections_per_host(opts.in_flight.max(1))
                .user_agent(format!("moge/{}", env!("CARGO_PKG_VERSION")))
                .build(),
        );
        let slots = Slots::new(opts.in_flight.max(1));
        let mut client = Client { base, agent, opts, info: Value::Null, format: AtomicU8::new(FORMAT_UNKNOWN), slots };
        // No retry when nothing answers (the usual mistake: reported at once), the retries for
        // a server that is there but not ready (503 while it loads).
        let (health, _) = client.call("/health", None, retries, again);
        match health {
            Ok(_) => {}
            Err(RemoteError::Unreachable { url, reason, attempts }) if reason.starts_with("connection refused") => {
                let reason = format!("{reason} (is `moge serve` running?)");
                return Err(RemoteError::Unreachable { url, reason, attempts }.into());
            }
            Err(e @ (RemoteError::Rejected { .. } | RemoteError::Protocol { .. })) => {
                return Err(anyhow::Error::new(e).context(format!("{} does not answer as a MoGe server", client.base)));
            }
            Err(e) => return Err(e.into()),
        }
        let (info, _) = client.call("/info", None, 0, Again { unreachable: false, timeout: false, ..again });
        client.info = match info {
            Ok(reply) => serde_json::from_slice(&reply.body).unwrap_or(Value::Null),
            Err(e @ RemoteError::Unreachable { .. }) => return Err(e.into()),
            Err(_) => Value::Null,
        };
        // A server that lists its formats spares the guess (and a second upload of an image
        // it refuses).
        if let Some(formats) = client.info.get("output_formats").and_then(Value::as_array) {
            let has = |f: OutputFormat| formats.iter().any(|v| v.as_str() == Some(f.name()));
            if has(OutputFormat::NpzBinary) {
                client.format = AtomicU8::new(FORMAT_BINARY);
            } else if has(OutputFormat::Npz) {
                client.format = AtomicU8::new(FORMAT_JSON);
            }
        }
        Ok(client)
    }

    /// The server's base URL, as requests are made to it.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// What `/info` returned.
    pub fn info(&self) -> &Value {
        &self.info
    }

    /// The model the server runs, where `/info` says.
    pub fn model(&self) -> Option<&str> {
        self.info_str(&["model", "model_name", "model_id"])
    }

    /// The device the server runs on, where `/info` says.
    pub fn device(&self) -> Option<&str> {
        self.info_str(&["device", "device_type", "hardware"])
    }

    /// Whether the server's model predicts normals; tt-MoGe does not say, and its published
    /// model has the normal head.
    pub fn has_normal(&self) -> bool {
        self.info.get("has_normal").and_then(Value::as_bool).unwrap_or(true)
    }

    /// The normals' element type to ask for: float32 where the server sends them as computed
    /// (moge serve), so that the outputs are a local run's; `None` (the server's float16) else.
    pub fn normal_dtype(&self) -> Option<NormalDtype> {
        let dtypes = self.info.get("npz_normal_dtypes").and_then(Value::as_array);
        dtypes.is_some_and(|d| d.iter().any(|t| t == "float32")).then_some(NormalDtype::Float32)
    }

    fn info_str(&self, keys: &[&str]) -> Option<&str> {
        keys.iter().find_map(|k| self.info.get(k).and_then(Value::as_str))
    }

    /// The geometry of one image file (`image`: its bytes, see [`image_for_server`](super::image_for_server)) with the
    /// options `req`. Their `output_format` is the client's to choose (see the module's
    /// documentation): what `req` says there is not sent.
    pub fn predict(&self, image: &[u8], req: &PredictOptions) -> Result<Response, RemoteError> {
        let image = BASE64.encode(image);
        let known = self.format.load(Ordering::Relaxed);
        if known == FORMAT_JSON {
            return self.predict_as(&image, req, OutputFormat::Npz);
        }
        match self.predict_as(&image, req, OutputFormat::NpzBinary) {
            Ok(r) => {
                self.format.store(FORMAT_BINARY, Ordering::Relaxed);
                Ok(r)
            }
            // A server without the binary answer refuses the format (FastAPI validation is
            // 422); the image may be what it refused, so the fallback is remembered only
            // once the JSON answer came.
            Err(RemoteError::Rejected { status: 400 | 422, .. }) if known == FORMAT_UNKNOWN => {
                let mut r = self.predict_as(&image, req, OutputFormat::Npz)?;
                self.format.store(FORMAT_JSON, Ordering::Relaxed);
                r.attempts += 1;
                Ok(r)
            }
            Err(e) => Err(e),
        }
    }

    fn predict_as(&self, image: &str, req: &PredictOptions, output_format: OutputFormat) -> Result<Response, RemoteError> {
        /// The JSON body: the image, then the options.
        #[derive(Serialize)]
        struct Body<'a> {
            image: &'a str,
            #[serde(flatten)]
            options: &'a PredictOptions,
        }
        let options = PredictOptions { output_format: Some(output_format), ..req.clone() };
        let body = Body { image, options: &options };
        let body = serde_json::to_vec(&body).expect("the request serialises");
        let again = Again { unreachable: self.opts.retry_no_answer, timeout: self.opts.retry_no_answer, limit: None };
        let (reply, attempts) = self.call("/predict", Some(&body), self.opts.retries, again);
        let url = self.endpoint("/predict");
        let (pred, meta) = {
            let reply = reply?;
            parse_prediction(reply.body, &reply.headers)
        }
        .map_err(|message| RemoteError::Protocol { url, message })?;
        let timing = |k: &str| meta.get("timing_ms").and_then(|t| t.get(k)).and_then(Value::as_f64);
        Ok(Response { device_ms: timing("device"), total_ms: timing("total"), pred, meta, attempts })
    }

    fn endpoint(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `path` until a 2xx, a failure not worth repeating, or `retries` more attempts; the
    /// attempts made.
    fn call(&self, path: &str, body: Option<&[u8]>, retries: u32, again: Again) -> (Result<Reply, RemoteError>, u32) {
        let url = self.endpoint(path);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt > retries;
            let backoff = self.backoff(attempt);
            let reply = {
                let _turn = self.slots.take();
                self.once(&url, body, again.limit)
            };
            let (error, wait) = match reply {
                Ok(r) if (200..300).contains(&r.status) => return (Ok(r), attempt),
                Ok(r) => {
                    let message = error_message(&r.body);
                    let status = r.status;
                    match status {
                        300..=399 => {
                            let to = r.headers.get("location").and_then(|v| v.to_str().ok()).unwrap_or("elsewhere");
                            let message = format!("redirected ({}) to {to}: give that URL instead", status_text(status));
                            return (Err(RemoteError::Protocol { url, message }), attempt);
                        }
                        408 | 429 | 500 | 502 | 503 | 504 => {
                            let wait = match status {
                                429 | 503 => retry_after(&r.headers).unwrap_or(backoff),
                                _ => backoff,
                            };
                            let e = if status < 500 {
                                RemoteError::Rejected { url: url.clone(), status, message }
                            } else {
                                RemoteError::Server { url: url.clone(), status, message, attempts: attempt }
                            };
                            (e, wait)
                        }
                        400..=499 => return (Err(RemoteError::Rejected { url, status, message }), attempt),
                        _ => return (Err(RemoteError::Server { url, status, message, attempts: attempt }), attempt),
                    }
                }
                Err(NoAnswer::Unreachable(reason)) => {
                    let e = RemoteError::Unreachable { url: self.base.clone(), reason, attempts: attempt };
                    if !again.unreachable {
                        return (Err(e), attempt);
                    }
                    (e, backoff)
                }
                Err(NoAnswer::Timeout) => {
                    let limit = again.limit.unwrap_or(self.opts.timeout).min(self.opts.timeout);
                    let e = RemoteError::Timeout { url: url.clone(), limit, attempts: attempt };
                    if !again.timeout {
                        return (Err(e), attempt);
                    }
                    (e, backoff)
                }
                Err(NoAnswer::Protocol(message)) => return (Err(RemoteError::Protocol { url, message }), attempt),
            };
            if last {
                return (Err(error), attempt);
            }
            std::thread::sleep(wait);
        }
    }

    /// The wait after failed attempt `n` (1-based).
    fn backoff(&self, n: u32) -> Duration {
        let base = self.opts.backoff;
        base.saturating_mul(1 << (n - 1).min(16)).min(base.max(MAX_BACKOFF))
    }

    /// One request and its whole answer, within `limit` where one is given.
    fn once(&self, url: &str, body: Option<&[u8]>, limit: Option<Duration>) -> Result<Reply, NoAnswer> {
        let time = Some(limit.unwrap_or(self.opts.timeout).min(self.opts.timeout));
        let sent = match body {
            Some(b) => self.agent.post(url).header("content-type", "application/json").config().timeout_global(time).build().send(b),
            None => self.agent.get(url).config().timeout_global(time).build().call(),
        };
        let mut resp = sent.map_err(no_answer)?;
        let status = resp.status().as_u16();
        let limit = if (200..300).contains(&status) { self.opts.max_response_bytes } else { MAX_ERROR_BODY };
        // The whole answer in one allocation where its length is given (a 1080p npz is ~60 MB:
        // growing a vector to it copies it several times over), up to a bound: what a server
        // declares is not trusted with more memory than it sends.
        let declared = resp.body().content_length().filter(|&n| n <= limit).unwrap_or(0).min(PREALLOCATE_MAX);
        let mut body = Vec::with_capacity(declared as usize);
        let read = std::io::Read::read_to_end(&mut resp.body_mut().with_config().limit(limit).reader(), &mut body);
        let body = match read {
            Ok(_) => body,
            Err(e) => match ureq::Error::from(e) {
                // An error's message cut short still says what it has to.
                ureq::Error::BodyExceedsLimit(_) if limit == MAX_ERROR_BODY => b"(a longer message)".to_vec(),
                e => return Err(no_answer(e)),
            },
        };
        Ok(Reply { status, headers: resp.headers().clone(), body })
    }
}

/// A transport failure in words, sorted by what to do about it.
fn no_answer(e: ureq::Error) -> NoAnswer {
    use std::io::ErrorKind as K;
    match e {
        ureq::Error::Timeout(_) => NoAnswer::Timeout,
        ureq::Error::HostNotFound => NoAnswer::Unreachable("host not found".into()),
        ureq::Error::ConnectionFailed => NoAnswer::Unreachable("connection failed".into()),
        ureq::Error::Io(io) => match io.kind() {
            K::TimedOut | K::WouldBlock => NoAnswer::Timeout,
            K::ConnectionRefused => NoAnswer::Unreachable("connection refused".into()),
            K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof | K::NotConnected => {
                NoAnswer::Unreachable(format!("the connection was closed with no answer ({io})"))
            }
            _ => NoAnswer::Unreachable(io.to_string()),
        },
        ureq::Error::BodyExceedsLimit(n) => NoAnswer::Protocol(format!("the answer is larger than the limit of {n} bytes")),
        e => NoAnswer::Protocol(e.to_string()),
    }
}

/// `Retry-After` in seconds (the HTTP-date form is left to the backoff), capped.
fn retry_after(headers: &ureq::http::HeaderMap) -> Option<Duration> {
    let secs: u64 = headers.get("retry-after")?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// `http://host:port/prefix` from what a person types: the scheme defaults to http, trailing
/// slashes go.
fn normalise_url(url: &str) -> Result<String> {
    let url = url.trim();
    if url.is_empty() {
        bail!("the server URL is empty");
    }
    let url = if url.contains("://") { url.to_owned() } else { format!("http://{url}") };
    let uri: ureq::http::Uri = url.parse().with_context(|| format!("`{url}` is not a server URL"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => bail!("`{url}` is not a server URL: the scheme must be http or https"),
    }
    if uri.host().is_none_or(str::is_empty) {
        bail!("`{url}` is not a server URL: it names no host");
    }
    if uri.query().is_some() {
        bail!("`{url}` is not a server URL: it has a query (`?...`)");
    }
    Ok(url.trim_end_matches('/').to_owned())
}
