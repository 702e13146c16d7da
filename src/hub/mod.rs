//! Weights from the Hugging Face hub, in the standard cache that Python's `huggingface_hub` shares:
//!
//! ```text
//! $HF_HOME/hub/models--Ruicheng--moge-2-vitl-normal/
//!     blobs/<sha256>                                  the file, named by its hub ETag
//!     snapshots/<commit>/model.pt -> ../../blobs/<sha256>
//!     refs/main                                       the commit that `main` pointed to
//! ```
//!
//! `hf-hub` names the cache paths ([`hf_hub::Cache`], [`hf_hub::Repo`]); the HTTP side is ours
//! (`download.rs` says why) so that a file is checked against the hub's sha256 before it
//! becomes visible, and so that `HF_HUB_OFFLINE` is honoured.

pub mod answer;
mod download;

use std::fmt;
use std::path::{Path, PathBuf};

use hf_hub::{Cache, Repo, RepoType};

/// Published MoGe-2 models: short name → Hugging Face repo.
pub const MODELS: &[(&str, &str)] = &[
    ("vits-normal", "Ruicheng/moge-2-vits-normal"),
    ("vitb-normal", "Ruicheng/moge-2-vitb-normal"),
    ("vitl-normal", "Ruicheng/moge-2-vitl-normal"),
    ("vitl", "Ruicheng/moge-2-vitl"),
    // MoGe-3: MoGe-2's ViT-L network and the sparse refiner (`moge/model/v3.py`).
    ("moge3-vitl", "Ruicheng/moge-3-vitl"),
    // MoGe-3 on DINOv2 ViT-g/14 (SwiGLU blocks).
    ("moge3-vitg", "Ruicheng/moge-3-vitg"),
];

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "vitl-normal";
/// The file every MoGe-2 and MoGe-3 repo publishes.
pub const FILENAME: &str = "model.pt";
/// The branch used when no revision is given.
pub const DEFAULT_REVISION: &str = "main";
const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The local path of a published model's `model.pt`, downloading it on first use.
pub fn resolve(name: &str) -> anyhow::Result<PathBuf> {
    resolve_revision(name, DEFAULT_REVISION)
}

/// [`resolve`] at a branch, tag or commit of the model's repo. A cached copy is used without
/// asking the hub; otherwise the file is downloaded (unless `HF_HUB_OFFLINE` is set).
pub fn resolve_revision(name: &str, revision: &str) -> anyhow::Result<PathBuf> {
    let hub = Hub::from_env()?;
    let target = Target::new(name, revision)?;
    if let Some(cached) = hub.cached(&target) {
        return Ok(cached.path);
    }
    Ok(hub.fetch(&target)?.cached.path)
}

/// The repo of a published model name.
pub fn repo_of(name: &str) -> anyhow::Result<&'static str> {
    MODELS.iter().find(|(n, _)| *n == name).map(|(_, r)| *r).ok_or_else(|| {
        let names: Vec<_> = MODELS.iter().map(|(n, _)| *n).collect();
        anyhow::anyhow!("unknown model '{name}': the published models are {}", names.join(", "))
    })
}

/// One model file at one revision: what is fetched and looked up.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub repo: &'static str,
    pub revision: String,
}

impl Target {
    pub fn new(name: &str, revision: &str) -> anyhow::Result<Self> {
        check_revision(revision)?;
        Ok(Self { name: name.to_string(), repo: repo_of(name)?, revision: revision.to_string() })
    }

    fn hf_repo(&self) -> Repo {
        Repo::with_revision(self.repo.to_string(), RepoType::Model, self.revision.clone())
    }

    /// `model.pt of Ruicheng/moge-2-vitl-normal at revision main`, for messages.
    fn describe(&self) -> String {
        format!("{FILENAME} of {} at revision {}", self.repo, self.revision)
    }
}

/// A revision becomes a path under `refs/` and a URL segment: refuse what could leave them.
fn check_revision(revision: &str) -> anyhow::Result<()> {
    let ok = !revision.is_empty()
        && !revision.starts_with('/')
        && revision.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
        && revision.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    anyhow::ensure!(ok, "'{revision}' is not a revision: give a branch, tag or commit of the model repo (e.g. main)");
    Ok(())
}

/// Whether a revision is a full commit hash (looked up in `snapshots/` directly, no ref).
fn is_commit_hash(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Where the hub and its cache are, from the variables `huggingface_hub` reads.
#[derive(Debug, Clone)]
pub struct Hub {
    /// The hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
    pub cache_dir: PathBuf,
    /// `$HF_ENDPOINT` or `https://huggingface.co`, without a trailing `/`.
    pub endpoint: String,
    /// `HF_HUB_OFFLINE` is set to a true value: use the cache only.
    pub offline: bool,
    token: Option<String>,
}

impl Hub {
    pub fn from_env() -> anyhow::Result<Self> {
        let var = |k: &str| std::env::var(k).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let hf_home = match var("HF_HOME") {
            Some(h) => PathBuf::from(h),
            None => {
                // hf-hub's own default ignores XDG_CACHE_HOME and panics without a home directory.
                let base = var("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| std::env::home_dir().map(|h| h.join(".cache")));
                let Some(base) = base else {
                    anyhow::bail!("cannot locate the Hugging Face cache: no home directory is known; set HF_HOME to a folder");
                };
                base.join("huggingface")
            }
        };
        let cache_dir = var("HF_HUB_CACHE").map(PathBuf::from).unwrap_or_else(|| hf_home.join("hub"));
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()).trim_end_matches('/').to_string();
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| is_true(&v));
        // `huggingface-cli login` writes $HF_HOME/token; HF_TOKEN wins over it.
        let token = var("HF_TOKEN").or_else(|| std::fs::read_to_string(hf_home.join("token")).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()));
        Ok(Self { cache_dir, endpoint, offline, token })
    }

    /// The folder of a repo in the cache, whether or not anything is there.
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.cache_dir.join(Repo::model(repo.to_string()).folder_name())
    }

    /// The cached copy of `target`, if there is a complete one.
    pub fn cached(&self, target: &Target) -> Option<Cached> {
        let commit = if is_commit_hash(&target.revision) {
            target.revision.clone()
        } else {
            let r = std::fs::read_to_string(self.repo_dir(target.repo).join("refs").join(&target.revision)).ok()?;
            r.trim().to_string()
        };
        if !answer::is_safe_name(&commit) {
            return None;
        }
        let path = Cache::new(self.cache_dir.clone()).repo(target.hf_repo()).pointer_path(&commit).join(FILENAME);
        // Follows the link: a snapshot whose blob was deleted is not a cached copy.
        let meta = std::fs::metadata(&path).ok().filter(|m| m.is_file())?;
        let sha256 = std::fs::canonicalize(&path).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().to_lowercase())).filter(|n| is_sha256(n));
        Some(Cached { path, commit, size: meta.len(), sha256 })
    }

    /// Asks the hub for `target` and makes sure the cache holds it, downloading (with a progress
    /// bar on a terminal) when the cache lacks that file.
    pub fn fetch(&self, target: &Target) -> Result<Fetched, HubError> {
        if self.offline {
            return Err(self.not_cached(target));
        }
        download::fetch(self, target)
    }

    /// The error for a file that is neither cached nor downloadable because HF_HUB_OFFLINE is set.
    pub fn not_cached(&self, target: &Target) -> HubError {
        HubError::new(
            ErrorKind::NotCached,
            format!(
                "model {} ({}) is not in the Hugging Face cache {} and HF_HUB_OFFLINE is set, so it cannot be downloaded: \
                 run `moge download --model {}` on a connected machine and copy that cache here (or point HF_HOME at it), \
                 or pass --weights PATH",
                target.name,
                target.describe(),
                self.cache_dir.display(),
                target.name
            ),
        )
    }
}

/// `huggingface_hub`'s reading of boolean variables.
fn is_true(v: &str) -> bool {
    matches!(v.to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE")
}

/// A model file in the cache.
#[derive(Debug, Clone)]
pub struct Cached {
    /// `snapshots/<commit>/model.pt`, the path to load.
    pub path: PathBuf,
    pub commit: String,
    pub size: u64,
    /// The sha256 the blob is named by (hub ETag), when it is one.
    pub sha256: Option<String>,
}

/// The outcome of [`Hub::fetch`].
#[derive(Debug, Clone)]
pub struct Fetched {
    pub cached: Cached,
    /// The bytes came over the network in this call (not already in the cache).
    pub downloaded: bool,
}

/// What went wrong; lets callers tell a hub they cannot reach from a real failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Offline and not cached.
    NotCached,
    /// No answer from the hub, or a temporary failure (5xx, 429).
    Unreachable,
    /// 404: no such repo, revision or file.
    NotFound,
    /// 401/403: a token is needed.
    Denied,
    /// The bytes do not match the hub's sha256 or size.
    Integrity,
    /// The transfer stopped part-way; a later run resumes.
    Interrupted,
    /// The endpoint does not answer like a Hugging Face hub.
    BadServer,
    /// The cache cannot be written.
    Io,
}

/// A one-line error that names what is missing, where, and the fix.
#[derive(Debug)]
pub struct HubError {
    pub kind: ErrorKind,
    message: String,
}

impl HubError {
    fn new(kind: ErrorKind, message: String) -> Self {
        Self { kind, message }
    }
}

impl fmt::Display for HubError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HubError {}

/// The sha256 of a file, lower-case hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => ctx.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(ctx.finish().as_ref().iter().map(|b| format!("{b:02x}")).collect())
}

/// The sha256 of a checkpoint for sidecars and `/info`, or why it is unavailable.
pub fn digest_or_reason(path: &Path) -> String {
    sha256_file(path).unwrap_or_else(|e| format!("unavailable: {}: cannot read: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_that_could_escape_the_cache_are_refused() {
        for ok in ["main", "v1.0", "refs/pr/1", "0123456789abcdef0123456789abcdef01234567"] {
            assert!(check_revision(ok).is_ok(), "{ok}");
        }
        for bad in ["", "/etc", "../x", "a/../b", "a//b", "a b", "a\\b", "main/"] {
            assert!(check_revision(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn offline_values_read_like_huggingface_hub() {
        for t in ["1", "true", "TRUE", "yes", "On"] {
            assert!(is_true(t), "{t}");
        }
        for f in ["0", "false", "no", "off", "2"] {
            assert!(!is_true(f), "{f}");
        }
    }

    #[test]
    fn unknown_model_names_list_the_published_ones() {
        let e = repo_of("vitx").unwrap_err().to_string();
        assert!(e.contains("vitx") && e.contains("vitl-normal") && e.contains("vits-normal"), "{e}");
        assert_eq!(repo_of("vitl").unwrap(), "Ruicheng/moge-2-vitl");
    }

    #[test]
    fn sha256_of_a_known_string() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("abc");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(sha256_file(&p).unwrap(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
