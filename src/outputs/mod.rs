//! Writing predictions to files. Every file is written under a temporary name in its target
//! directory and renamed into place, so an interrupted run never leaves a partial file.

pub mod npz;

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Writes `path` atomically: `write` fills a temporary file beside it, which is renamed over
/// `path` only after it was written and flushed completely.
pub fn write_atomic(path: &Path, write: impl FnOnce(&mut std::fs::File) -> Result<()>) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create the directory", dir.display()))?;
    let tmp = temp_name(path);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).with_context(|| format!("{}: cannot create", tmp.display()))?;
        write(&mut f).with_context(|| format!("{}: cannot write", path.display()))?;
        f.flush()?;
        f.sync_all().ok();
        std::fs::rename(&tmp, path).with_context(|| format!("{}: cannot rename into place", path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `dir/.name.moge-tmp-PID`: hidden, unique per process, and recognisable for cleanup.
pub fn temp_name(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.moge-tmp-{}", std::process::id()))
}
