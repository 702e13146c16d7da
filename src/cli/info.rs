//! `moge info` (alias `moge models`): the published models, which are cached, where, size, sha256.

use anyhow::Result;
use clap::Args;
use serde::Serialize;

use super::{EXIT_OK, EXIT_SOME_FAILED};
use moge::hub::{sha256_file, Hub, Target, DEFAULT_REVISION, MODELS};

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Print a JSON list of the models: name, repo, revision, cached, path, size, sha256, commit, repo_dir.
    #[arg(long)]
    pub json: bool,
    /// Branch, tag or commit to look up in the cache.
    #[arg(long, value_name = "REV", default_value = DEFAULT_REVISION)]
    pub revision: String,
    /// Re-hash every cached file and compare with the sha256 it is stored under (reads them all).
    #[arg(long)]
    pub verify: bool,
}

#[derive(Serialize, Debug)]
struct Entry {
    name: &'static str,
    repo: &'static str,
    revision: String,
    cached: bool,
    /// The file to load: `snapshots/<commit>/model.pt`.
    path: Option<String>,
    size: Option<u64>,
    sha256: Option<String>,
    commit: Option<String>,
    /// The repo's folder in the cache, where the file is looked for.
    repo_dir: String,
    /// With --verify: whether the content hashes to `sha256`.
    #[serde(skip_serializing_if = "Option::is_none")]
    verified: Option<bool>,
}

pub fn run(args: InfoArgs) -> Result<i32> {
    let hub = Hub::from_env()?;
    let mut entries = Vec::new();
    for (name, repo) in MODELS {
        let target = Target::new(name, &args.revision)?;
        let cached = hub.cached(&target);
        let verified = match (&cached, args.verify) {
            (Some(c), true) => Some(match &c.sha256 {
                Some(want) => &sha256_file(&c.path)? == want,
                None => false,
            }),
            _ => None,
        };
        entries.push(Entry {
            name,
            repo,
            revision: args.revision.clone(),
            cached: cached.is_some(),
            path: cached.as_ref().map(|c| c.path.display().to_string()),
            size: cached.as_ref().map(|c| c.size),
            sha256: cached.as_ref().and_then(|c| c.sha256.clone()),
            commit: cached.as_ref().map(|c| c.commit.clone()),
            repo_dir: hub.repo_dir(repo).display().to_string(),
            verified,
        });
    }
    if args.json {
        moge::outln!("{}", serde_json::to_string_pretty(&entries)?);
    } else {
        print_text(&hub, &entries);
    }
    Ok(if entries.iter().any(|e| e.verified == Some(false)) { EXIT_SOME_FAILED } else { EXIT_OK })
}

fn print_text(hub: &Hub, entries: &[Entry]) {
    moge::outln!("Hugging Face cache: {}", hub.cache_dir.display());
    let offline = if hub.offline { " (not used: HF_HUB_OFFLINE is set)" } else { "" };
    moge::outln!("hub: {}{offline}", hub.endpoint);
    // What `--device auto` takes on this machine (and why not the GPU, where it does not).
    let device = match moge::device::open(moge::device::DeviceRequest::Auto) {
        Ok(d) => match &d.cpu_because {
            Some(why) => format!("{} ({why})", d.name),
            None => d.describe(),
        },
        Err(e) => format!("cpu ({e})"),
    };
    moge::outln!("device (--device auto): {device}");
    // The CPU kernels' route, at the precision `--precision auto` takes on the CPU.
    moge::outln!("{}", moge::model::cpu::route_description(super::Precision::Auto.resolve(&moge::Device::Cpu)));
    moge::outln!();
    for e in entries {
        let head = format!("{:<12}{:<29}", e.name, e.repo);
        match (&e.path, e.size) {
            (Some(path), Some(size)) => {
                let commit = e.commit.as_deref().unwrap_or("");
                moge::outln!("{head}cached, {}, commit {}", indicatif::HumanBytes(size), &commit[..commit.len().min(12)]);
                moge::outln!("    path    {path}");
                let check = match e.verified {
                    Some(true) => "  (verified)".to_string(),
                    Some(false) => {
                        let blob = std::fs::canonicalize(path).map(|p| p.display().to_string()).unwrap_or_else(|_| path.clone());
                        format!("  (MISMATCH: the file is damaged; delete {blob} and run `moge download --model {}`)", e.name)
                    }
                    None => String::new(),
                };
                moge::outln!("    sha256  {}{check}", e.sha256.as_deref().unwrap_or("unknown"));
            }
            _ => moge::outln!("{head}not cached (revision {}): moge download --model {}", e.revision, e.name),
        }
    }
}
