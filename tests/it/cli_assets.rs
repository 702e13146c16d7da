//! The committed man pages (`man/`) and shell completions (`completions/`) are what the clap
//! definition generates now: a changed option without regenerated assets fails here.

use std::collections::BTreeMap;
use std::path::Path;

use crate::support::cli::moge;
use crate::support::paths::repo;

fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    for sub in ["man", "completions"] {
        let Ok(rd) = std::fs::read_dir(dir.join(sub)) else { continue };
        for e in rd.flatten() {
            m.insert(format!("{sub}/{}", e.file_name().to_string_lossy()), std::fs::read(e.path()).unwrap());
        }
    }
    m
}

#[test]
fn man_pages_and_completions_are_up_to_date() {
    let tmp = tempfile::tempdir().unwrap();
    let st = moge().arg("generate-assets").arg(tmp.path()).status().unwrap();
    assert!(st.success());
    let fresh = files(tmp.path());
    assert!(fresh.contains_key("man/moge.1") && fresh.contains_key("man/moge-batch.1"));
    assert!(fresh.contains_key("completions/moge.bash") && fresh.contains_key("completions/_moge") && fresh.contains_key("completions/moge.fish"));
    let committed = files(repo());
    let stale: Vec<&String> = fresh.keys().chain(committed.keys()).filter(|k| fresh.get(*k) != committed.get(*k)).collect();
    assert!(
        stale.is_empty(),
        "man/ or completions/ are stale ({stale:?}); regenerate them with\n    cargo run --release -- generate-assets .\nand commit the result"
    );
}
