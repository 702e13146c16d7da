//! Fetching `model.pt` into the cache: ask the hub, download to `blobs/<etag>.incomplete` (resumed
//! with a Range request), check the sha256, then rename to the blob and link the snapshot.
//!
//! hf-hub 0.5's own download is not used: its requests have no timeouts, it panics on a redirect
//! without `Location`, it renames the temporary file into `blobs/` without checking its hash or
//! length, and a resumed download appends whatever the server sends even if it ignored the Range.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use hf_hub::Cache;
use indicatif::{ProgressBar, ProgressStyle};
use ureq::config::RedirectAuthHeaders;

use super::answer::{range_continues, read_head, Head};
use super::{is_sha256, sha256_file, Cached, ErrorKind, Fetched, Hub, HubError, Target, FILENAME};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A stalled transfer (no byte for this long) counts as interrupted.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Transfers per run; each one resumes where the last stopped.
const ATTEMPTS: u32 = 3;
const MAX_REDIRECTS: u32 = 10;

/// What the hub says about a file.
struct Remote {
    /// The `resolve` URL after the hub's own (relative) redirects.
    url: String,
    etag: String,
    commit: String,
    size: u64,
}

fn agent(max_redirects: u32) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_recv_response(Some(READ_TIMEOUT))
        .timeout_per_read(Some(READ_TIMEOUT))
        .max_redirects(max_redirects)
        // The token is for the hub, not for the storage it redirects downloads to.
        .redirect_auth_headers(RedirectAuthHeaders::SameHost)
        .http_status_as_error(false)
        // Size and sha256 are those of the stored bytes, not of a compressed transfer.
        .accept_encoding("identity")
        .user_agent(concat!("moge/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

pub(super) fn fetch(hub: &Hub, target: &Target) -> Result<Fetched, HubError> {
    let remote = metadata(hub, target)?;
    let cache = Cache::new(hub.cache_dir.clone()).repo(target.hf_repo());
    let blob = cache.blob_path(&remote.etag);
    let mut downloaded = false;
    if !blob.is_file() {
        let blobs = blob.parent().expect("blob_path has a parent");
        fs::create_dir_all(blobs).map_err(|e| io_error(hub, blobs, e))?;
        // Same lock file as huggingface_hub, so Python and moge do not download the same blob at once.
        let lock_path = hub.cache_dir.join(".locks").join(target.hf_repo().folder_name()).join(format!("{}.lock", remote.etag));
        let _lock = lock(&lock_path, target).map_err(|e| io_error(hub, &lock_path, e))?;
        if !blob.is_file() {
            download(hub, target, &remote, &blob)?;
            downloaded = true;
        }
    }
    let pointer = cache.pointer_path(&remote.commit).join(FILENAME);
    link(&blob, &pointer).map_err(|e| io_error(hub, &pointer, e))?;
    // Written after the snapshot, so a reader that follows the ref always finds the file.
    if target.revision != remote.commit {
        cache.create_ref(&remote.commit).map_err(|e| io_error(hub, &hub.repo_dir(target.repo).join("refs"), e))?;
    }
    let sha256 = is_sha256(&remote.etag).then(|| remote.etag.to_lowercase());
    Ok(Fetched { cached: Cached { path: pointer, commit: remote.commit, size: remote.size, sha256 }, downloaded })
}

/// A HEAD request, as `huggingface_hub` makes it. Relative redirects (a renamed repo) are
/// followed; an absolute one goes to the file storage, and the hub's answer already carries
/// the file's sha256 and size in `X-Linked-Etag` / `X-Linked-Size`.
fn metadata(hub: &Hub, target: &Target) -> Result<Remote, HubError> {
    let repo = target.hf_repo();
    let mut url = format!("{}/{}/resolve/{}/{FILENAME}", hub.endpoint, repo.url(), repo.url_revision());
    let agent = agent(0);
    for _ in 0..MAX_REDIRECTS {
        let resp = authorized(hub, agent.head(&url)).call().map_err(|e| unreachable(hub, target, &e))?;
        let headers = resp.headers();
        match read_head(&url, resp.status().as_u16(), |name| headers.get(name).and_then(|v| v.to_str().ok())) {
            Head::Redirect(next) => url = next,
            Head::Status(status) => return Err(status_error(hub, target, status)),
            Head::Bad(what) => return Err(bad_server(hub, target, &format!("answered {url} {what}"))),
            Head::File { etag, commit, size } => return Ok(Remote { url, etag, commit, size }),
        }
    }
    Err(bad_server(hub, target, &format!("redirected {url} more than {MAX_REDIRECTS} times")))
}

fn authorized<B>(hub: &Hub, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
    match &hub.token {
        Some(t) => req.header("Authorization", format!("Bearer {t}")),
        None => req,
    }
}

/// Why one transfer stopped.
enum Stop {
    /// Worth another attempt from where it stopped.
    Retry(String),
    Fatal(HubError),
}

fn download(hub: &Hub, target: &Target, remote: &Remote, blob: &Path) -> Result<(), HubError> {
    let incomplete = blob.with_file_name(format!("{}.incomplete", remote.etag));
    let io = |e: std::io::Error| io_error(hub, &incomplete, e);
    // Partial data from an earlier run (or from huggingface_hub) is a prefix to resume from.
    let mut file = OpenOptions::new().create(true).append(true).open(&incomplete).map_err(io)?;
    // Drawn on stderr, and only when that is a terminal.
    let bar = ProgressBar::new(remote.size);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(target.name.clone());
    crate::errln!("moge: downloading {} ({}, {}) into {}", target.name, target.describe(), indicatif::HumanBytes(remote.size), hub.cache_dir.display());
    let agent = agent(MAX_REDIRECTS);
    if file.metadata().map_err(io)?.len() > remote.size {
        // A partial file longer than the file is not a prefix of it.
        file.set_len(0).map_err(io)?;
    }
    let mut last_stop = String::from("no data");
    for attempt in 0..ATTEMPTS {
        let have = file.metadata().map_err(io)?.len();
        // Complete, or longer than announced (rejected below).
        if have >= remote.size {
            break;
        }
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(500 * u64::from(attempt)));
        }
        match transfer(hub, target, remote, &agent, &mut file, have, &bar) {
            Ok(()) => last_stop = "the server closed the connection early".into(),
            Err(Stop::Retry(why)) => last_stop = why,
            Err(Stop::Fatal(e)) => {
                bar.finish_and_clear();
                return Err(e);
            }
        }
    }
    bar.finish_and_clear();
    let got = file.metadata().map_err(io)?.len();
    if got < remote.size {
        return Err(HubError::new(
            ErrorKind::Interrupted,
            format!(
                "the download of {} from {} was interrupted after {got} of {} bytes ({last_stop}); the partial file {} is kept \
                 and nothing was cached: run the command again to resume",
                target.describe(),
                hub.endpoint,
                remote.size,
                incomplete.display()
            ),
        ));
    }
    file.sync_all().map_err(io)?;
    drop(file);
    let reject = |what: String| {
        let _ = fs::remove_file(&incomplete);
        HubError::new(
            ErrorKind::Integrity,
            format!(
                "the downloaded {} {what}; it was deleted and nothing was cached: run the command again, and if this repeats, \
                 check the hub HF_ENDPOINT={}",
                target.describe(),
                hub.endpoint
            ),
        )
    };
    if got > remote.size {
        return Err(reject(format!("is {got} bytes but the hub announced {}", remote.size)));
    }
    if is_sha256(&remote.etag) {
        let sha = sha256_file(&incomplete).map_err(io)?;
        if !sha.eq_ignore_ascii_case(&remote.etag) {
            return Err(reject(format!("has sha256 {sha} but the hub announced {}", remote.etag.to_lowercase())));
        }
    } else {
        crate::errln!("moge: warning: the hub gave no sha256 for {} (ETag {}); only its size was checked", target.describe(), remote.etag);
    }
    fs::rename(&incomplete, blob).map_err(io)?;
    Ok(())
}

/// One GET from `have` to the end, appended to `file`.
fn transfer(hub: &Hub, target: &Target, remote: &Remote, agent: &ureq::Agent, file: &mut File, have: u64, bar: &ProgressBar) -> Result<(), Stop> {
    let fatal_io = |e: std::io::Error| Stop::Fatal(io_error(hub, &hub.repo_dir(target.repo).join("blobs"), e));
    let mut req = authorized(hub, agent.get(&remote.url));
    if have > 0 {
        req = req.header("Range", format!("bytes={have}-"));
    }
    let resp = req.call().map_err(|e| Stop::Retry(transport_cause(&e)))?;
    let status = resp.status().as_u16();
    match status {
        206 => {
            let range = resp.headers().get("content-range").and_then(|v| v.to_str().ok());
            if !range_continues(range, have) {
                let range = range.unwrap_or("");
                return Err(Stop::Fatal(bad_server(hub, target, &format!("answered a request for bytes {have}- with Content-Range '{range}'"))));
            }
        }
        // The whole file, whatever was asked: start over.
        200 => file.set_len(0).map_err(fatal_io)?,
        408 | 429 | 500..=599 => return Err(Stop::Retry(format!("HTTP {status}"))),
        _ => return Err(Stop::Fatal(status_error(hub, target, status))),
    }
    let mut written = file.metadata().map_err(fatal_io)?.len();
    bar.set_position(written);
    let mut body = resp.into_body().into_reader();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Stop::Retry(e.to_string())),
        };
        file.write_all(&buf[..n]).map_err(fatal_io)?;
        written += n as u64;
        bar.set_position(written);
        if written > remote.size {
            // Longer than announced: not the file; no need to read the rest.
            return Ok(());
        }
    }
}

/// Links `snapshots/<commit>/model.pt` to the blob, replacing an older link atomically.
fn link(blob: &Path, pointer: &Path) -> std::io::Result<()> {
    let dir = pointer.parent().expect("pointer_path has a parent");
    fs::create_dir_all(dir)?;
    if let (Ok(a), Ok(b)) = (fs::canonicalize(pointer), fs::canonicalize(blob)) {
        if a == b {
            return Ok(());
        }
    }
    let tmp = dir.join(format!(".{FILENAME}.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&tmp);
    #[cfg(unix)]
    {
        // Relative like huggingface_hub's links, so the cache can be moved or mounted elsewhere.
        // The file sits at the top of the snapshot, two levels under the repo folder.
        let blob_name = blob.file_name().expect("blob_path has a file name");
        std::os::unix::fs::symlink(Path::new("../../blobs").join(blob_name), &tmp)?;
    }
    #[cfg(not(unix))]
    {
        if fs::hard_link(blob, &tmp).is_err() {
            fs::copy(blob, &tmp)?;
        }
    }
    fs::rename(&tmp, pointer)
}

/// An exclusive lock held until the returned file is dropped.
fn lock(path: &Path, target: &Target) -> std::io::Result<File> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let file = OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let fd = file.as_raw_fd();
        // SAFETY: flock on a descriptor this function owns; it is released when `file` closes.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                crate::errln!("moge: waiting for another download of {} to finish (lock {})", target.describe(), path.display());
                // SAFETY: as above.
                if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // Other failures (a file system without locks): go on; the sha256 check still guards the blob.
        }
    }
    #[cfg(not(unix))]
    let _ = target;
    Ok(file)
}

fn transport_cause(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Io(io) => io.to_string(),
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::Timeout(_) => "timed out".into(),
        e => e.to_string(),
    }
}

fn unreachable(hub: &Hub, target: &Target, e: &ureq::Error) -> HubError {
    HubError::new(
        ErrorKind::Unreachable,
        format!(
            "cannot reach the Hugging Face hub at {} ({}) to download model {} ({}), and it is not in the cache {}: \
             run `moge download --model {}` on a connected machine (HF_ENDPOINT selects a mirror), or pass --weights PATH",
            hub.endpoint,
            transport_cause(e),
            target.name,
            target.describe(),
            hub.cache_dir.display(),
            target.name
        ),
    )
}

fn status_error(hub: &Hub, target: &Target, status: u16) -> HubError {
    let (kind, fix) = match status {
        404 => (ErrorKind::NotFound, "check --revision, and HF_ENDPOINT if it points at a mirror".to_string()),
        401 | 403 => (ErrorKind::Denied, "set HF_TOKEN to a Hugging Face token that can read the repo".to_string()),
        408 | 429 | 500..=599 => (ErrorKind::Unreachable, "try again later, or pass --weights PATH".to_string()),
        _ => (ErrorKind::BadServer, format!("check HF_ENDPOINT={}", hub.endpoint)),
    };
    let what = if status == 404 { "has no" } else { "refused" };
    HubError::new(kind, format!("the hub at {} {what} {} (HTTP {status}): {fix}", hub.endpoint, target.describe()))
}

fn bad_server(hub: &Hub, target: &Target, what: &str) -> HubError {
    HubError::new(
        ErrorKind::BadServer,
        format!("the hub at {} {what}, so {} cannot be downloaded from it: check HF_ENDPOINT, or pass --weights PATH", hub.endpoint, target.describe()),
    )
}

fn io_error(hub: &Hub, path: &Path, e: std::io::Error) -> HubError {
    HubError::new(
        ErrorKind::Io,
        format!(
            "cannot write {} in the Hugging Face cache {} ({e}): check its permissions and free space, or set HF_HOME to another folder",
            path.display(),
            hub.cache_dir.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::super::answer::{clean_etag, is_safe_name, join_origin};

    #[test]
    fn etags_are_normalised_like_huggingface_hub() {
        assert_eq!(clean_etag("\"abc\""), "abc");
        assert_eq!(clean_etag("W/\"abc\""), "abc");
        assert_eq!(clean_etag(" abc "), "abc");
    }

    #[test]
    fn server_names_that_could_leave_the_blob_folder_are_refused() {
        assert!(is_safe_name("0123abcd"));
        assert!(is_safe_name("abc-1_2.x"));
        for bad in ["", "..", ".hidden", "a/b", "../../etc", "a b", "a\\b"] {
            assert!(!is_safe_name(bad), "{bad}");
        }
    }

    #[test]
    fn relative_redirects_stay_on_the_hub() {
        assert_eq!(join_origin("http://127.0.0.1:8080/a/resolve/main/model.pt", "/b/resolve/main/model.pt"), "http://127.0.0.1:8080/b/resolve/main/model.pt");
        assert_eq!(join_origin("https://huggingface.co/x", "/y"), "https://huggingface.co/y");
    }
}
