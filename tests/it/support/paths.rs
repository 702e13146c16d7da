//! Where the tests find the repository's files.

use std::path::{Path, PathBuf};

/// The repository root (the package's manifest directory).
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `tests/fixtures/`: checkpoints, photos and the upstream references made by `tests/make_fixtures.py`.
pub fn fixtures() -> PathBuf {
    repo().join("tests/fixtures")
}

/// `tests/fuzz/corpus/<target>/`: the committed corpus of one fuzz target.
pub fn corpus(target: &str) -> PathBuf {
    repo().join("tests/fuzz/corpus").join(target)
}
