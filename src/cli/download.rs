//! `moge download [--model NAME]... [--revision REV]`: fill the Hugging Face cache ahead of time.

use anyhow::Result;
use clap::Args;

use super::{model_names, EXIT_FATAL, EXIT_OK};
use moge::hub::{Cached, ErrorKind, Hub, HubError, Target, DEFAULT_MODEL, DEFAULT_REVISION};

#[derive(Args, Debug)]
pub struct DownloadArgs {
    /// A published model to fetch; repeat for several [default: vitl-normal].
    #[arg(long = "model", value_name = "NAME", value_parser = model_names())]
    pub models: Vec<String>,
    /// Branch, tag or commit of the model repos.
    #[arg(long, value_name = "REV", default_value = DEFAULT_REVISION)]
    pub revision: String,
}

pub fn run(args: DownloadArgs) -> Result<i32> {
    let hub = Hub::from_env()?;
    let mut names: Vec<String> = Vec::new();
    for n in args.models {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    if names.is_empty() {
        names.push(DEFAULT_MODEL.to_string());
    }
    let mut failed = 0usize;
    for name in &names {
        let target = Target::new(name, &args.revision)?;
        match get(&hub, &target) {
            Ok((c, how)) => {
                moge::outln!("{name}: {} ({}, sha256 {}, {how})", c.path.display(), indicatif::HumanBytes(c.size), c.sha256.as_deref().unwrap_or("unknown"))
            }
            Err(e) => {
                failed += 1;
                moge::errln!("moge: {e}");
            }
        }
    }
    Ok(if failed == 0 { EXIT_OK } else { EXIT_FATAL })
}

/// The cached copy after asking the hub, and how it got there.
fn get(hub: &Hub, target: &Target) -> Result<(Cached, &'static str), HubError> {
    if hub.offline {
        return hub.cached(target).map(|c| (c, "cached; HF_HUB_OFFLINE is set, the hub was not asked")).ok_or_else(|| hub.not_cached(target));
    }
    match hub.fetch(target) {
        Ok(f) => Ok((f.cached, if f.downloaded { "downloaded" } else { "already cached" })),
        // A copy we have is still usable when the hub cannot be asked whether it is the latest.
        Err(e) if e.kind == ErrorKind::Unreachable => match hub.cached(target) {
            Some(c) => {
                moge::errln!(
                    "moge: warning: cannot reach the hub at {}; keeping the cached {} from commit {}, which may not be the latest",
                    hub.endpoint,
                    target.name,
                    c.commit
                );
                Ok((c, "cached; the hub was unreachable"))
            }
            None => Err(e),
        },
        Err(e) => Err(e),
    }
}
