//! `moge serve`: the model loaded once, answering HTTP (see [`moge::server`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use super::{InputArgs, ModelArgs, EXIT_OK};
use moge::fit::Canvas;
use moge::server::{self, Service};

#[derive(Args, Debug)]
#[command(after_help = "The API is that of the Tenstorrent MoGe-2 server (tt-MoGe): POST /predict with JSON {\"image\": base64, \
\"output_format\": \"npz\"|\"png\"|\"json\"|\"npz_binary\", ...} or with the image file as the body and the options in the query \
string; GET /info; GET /metrics (Prometheus text format). The server listens from the start: GET /health/live answers 200 at once \
(liveness), GET /health 503 until the model is loaded and, with --warmup, warmed up (readiness). When ready, one line \
'moge: listening on http://HOST:PORT' goes to stdout. Ctrl-C or SIGTERM makes /health answer 503, stops taking requests, finishes \
those in progress and exits 0.")]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0 or :: for every interface).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub host: String,
    /// Port; when it is taken, the next free one above it (0: any free port).
    #[arg(long, value_name = "N", default_value_t = 20000)]
    pub port: u16,
    /// Host threads for decoding and for encoding, each; default: the number of CPUs, at most 8.
    #[arg(short, long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: Option<u32>,
    /// Requests in progress at most; past it the answer is 503 with Retry-After. Memory grows
    /// with it: 8 concurrent 1080p requests for base64 npz peaked at 590 MB with a small model
    /// (17 MB idle), the maps and their encodings of each.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub queue: u32,
    /// Largest request body in MB (413 above it).
    #[arg(long, value_name = "MB", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_body_mb: u32,
    /// Largest num_tokens a request may ask for (memory and time grow with it).
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = super::parse_num_tokens)]
    pub max_tokens: u32,
    /// The canvas of fit: pad and fit: stretch.
    #[arg(long, value_name = "WxH", default_value = "1920x1080")]
    pub canvas: Canvas,
    /// Metres per unit of depth_png16.
    #[arg(long, value_name = "M", default_value_t = 0.001, value_parser = super::parse_positive)]
    pub depth_scale: f32,
    /// How the npz arrays are stored (see `moge batch --help`).
    #[arg(long, value_enum, value_name = "HOW", default_value_t = moge::outputs::npz::Compression::default().into())]
    pub npz_compression: super::values::CompressionArg,
    /// Run one forward on a --canvas sized image before answering /health with 200, so that the
    /// first request is not slow.
    #[arg(long)]
    pub warmup: bool,
    #[command(flatten)]
    pub input: InputArgs,
}

pub fn run(args: ServeArgs) -> Result<i32> {
    let jobs = args.jobs.map(|j| j as usize).unwrap_or_else(moge::pipeline::run::default_jobs);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(2 * jobs + 4)
        .thread_name("moge-http")
        .enable_all()
        .build()
        .context("cannot start the HTTP runtime")?;
    let service = Service::new();
    let ran = runtime.block_on(async {
        // Listening first: a cluster's liveness probe is answered while a large model loads.
        let listener = server::bind(&args.host, args.port).await?;
        let addr = listener.local_addr()?;
        let mut serving = tokio::spawn(server::serve(listener, service.clone()));
        let model_args = args.model.clone();
        let loading = tokio::task::spawn_blocking(move || model_args.load());
        // Ctrl-C or SIGTERM while the model loads stops the server at once.
        let (weights, model) = tokio::select! {
            loaded = loading => loaded.context("loading the model")??,
            stopped = &mut serving => return stopped.context("the HTTP server stopped")?.map(drop),
        };
        let cfg = server::Config {
            model_id: args.model.id(),
            weights,
            decode: args.input.options(),
            canvas: args.canvas,
            depth_png_scale: args.depth_scale,
            npz_compression: args.npz_compression.into(),
            jobs,
            queue: args.queue as usize,
            max_body: args.max_body_mb as usize * 1_000_000,
            body_timeout: Duration::from_secs(60),
            max_tokens: args.max_tokens,
        };
        let summary = format!("{} ({}, {:?}, {})", cfg.model_id, model.config.encoder.backbone, model.precision, moge::device::name_of(&model.device));
        service.load(Arc::new(model), cfg);
        if args.warmup {
            let sv = service.clone();
            let warming = tokio::task::spawn_blocking(move || sv.warm_up());
            let took = tokio::select! {
                took = warming => took.context("warming up")??,
                stopped = &mut serving => return stopped.context("the HTTP server stopped")?.map(drop),
            };
            moge::errln!("moge: warmed up: one forward at {}x{} in {took:.0} ms", args.canvas.width, args.canvas.height);
        }
        service.ready();
        moge::errln!("moge: serving {summary}; Ctrl-C stops");
        // The one line scripts wait for.
        moge::outln!("moge: listening on http://{addr}");
        serving.await.context("the HTTP server stopped")??;
        anyhow::Ok(())
    });
    // A load still running (stopped before it ended) is not waited for.
    runtime.shutdown_background();
    ran?;
    service.close();
    moge::errln!("moge: stopped");
    Ok(EXIT_OK)
}
