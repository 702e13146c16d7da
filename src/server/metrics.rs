//! `GET /metrics`: what a cluster's monitoring scrapes, in the Prometheus text format
//! (OpenMetrics 1.0): predictions by status, request and device latency, the requests in progress
//! and at the device, images done, and whether the server is ready.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: u16,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<StatusLabel, Counter>,
    request_seconds: Histogram,
    device_seconds: Histogram,
    in_progress: Gauge,
    at_device: Gauge,
    images: Counter,
    ready: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<StatusLabel, Counter>::default();
        // 5 ms to ~80 s, doubling: a small model's forward on a GPU to a 12-megapixel photo on a
        // CPU.
        let request_seconds = Histogram::new(exponential_buckets(0.005, 2.0, 15));
        let device_seconds = Histogram::new(exponential_buckets(0.005, 2.0, 15));
        let (in_progress, at_device, images, ready) = (Gauge::default(), Gauge::default(), Counter::default(), Gauge::default());
        registry.register("moge_requests", "Predictions answered, by HTTP status", requests.clone());
        registry.register("moge_request_duration_seconds", "Time from a prediction's arrival to its answer", request_seconds.clone());
        registry.register("moge_device_duration_seconds", "Time of one forward on the device", device_seconds.clone());
        registry.register("moge_requests_in_progress", "Predictions admitted and not yet answered (at most --queue)", in_progress.clone());
        registry.register("moge_device_queue_depth", "Predictions waiting for the device or on it", at_device.clone());
        registry.register("moge_images", "Images predicted", images.clone());
        registry.register("moge_ready", "1 once the model is loaded (and warmed up with --warmup), 0 before and while stopping", ready.clone());
        Metrics { registry, requests, request_seconds, device_seconds, in_progress, at_device, images, ready }
    }
}

/// Holds a gauge one higher while it lives.
pub struct Held<'a>(&'a Gauge);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Metrics {
    /// A prediction answered with `status` after `seconds`.
    pub fn answered(&self, status: u16, seconds: f64) {
        self.requests.get_or_create(&StatusLabel { status }).inc();
        self.request_seconds.observe(seconds);
        if status == 200 {
            self.images.inc();
        }
    }

    pub fn forward(&self, seconds: f64) {
        self.device_seconds.observe(seconds);
    }

    pub fn in_progress(&self) -> Held<'_> {
        self.in_progress.inc();
        Held(&self.in_progress)
    }

    pub fn at_device(&self) -> Held<'_> {
        self.at_device.inc();
        Held(&self.at_device)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String does not fail");
        out
    }
}
