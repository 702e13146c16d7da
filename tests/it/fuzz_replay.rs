//! Every way bytes enter moge, replayed in CI on stable: the committed fuzz corpus
//! (tests/fuzz/corpus/<target>/, seeds and every input the fuzzers found a fault with) plus a few
//! thousand seeded mutations of it (bit flips, truncations, splices of other files, boundary
//! integers, inserted and deleted runs). The entry points are those of the cargo-fuzz targets
//! (tests/fuzz/targets.rs). Each input must give a value or an error: no panic, no input that
//! takes seconds, no single allocation beyond 1 GiB. Each target's replay runs in a process of
//! its own, where no other test's allocations count.

#[path = "../fuzz/targets.rs"]
mod targets;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::own_process::own_process;
use crate::support::paths::{corpus, fixtures};
use crate::support::rng::Rng;

/// The largest single allocation asked for, process-wide (this allocator serves the whole test
/// binary).
struct Counting;
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator with its arguments unchanged, so the memory
// handed out is System's, which meets GlobalAlloc's contract; the count beside it is one atomic
// update, which neither allocates nor unwinds.
unsafe impl GlobalAlloc for Counting {
    /// # Safety
    /// As [`GlobalAlloc::alloc`].
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        // SAFETY: the caller meets `alloc`'s contract (a layout of non-zero size), System's.
        unsafe { System.alloc(l) }
    }
    /// # Safety
    /// As [`GlobalAlloc::alloc_zeroed`].
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        // SAFETY: the caller meets `alloc_zeroed`'s contract, System's.
        unsafe { System.alloc_zeroed(l) }
    }
    /// # Safety
    /// As [`GlobalAlloc::realloc`].
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LARGEST.fetch_max(new, Ordering::Relaxed);
        // SAFETY: the caller meets `realloc`'s contract, and `p` came from this allocator, i.e.
        // from System.
        unsafe { System.realloc(p, l, new) }
    }
    /// # Safety
    /// As [`GlobalAlloc::dealloc`].
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller meets `dealloc`'s contract, and `p` came from this allocator, i.e.
        // from System.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const MAX_ALLOC: usize = 1 << 30;
const SLOW: Duration = Duration::from_secs(10);

fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(3) {
        let n = v.len();
        match rng.below(6) {
            0 if n > 0 => {
                for _ in 0..1 + rng.below(8) {
                    let i = rng.below(n);
                    v[i] ^= 1 << rng.below(8);
                }
            }
            1 => v.truncate(rng.below(n + 1)),
            2 if !other.is_empty() => {
                let (a, len) = (rng.below(other.len()), 1 + rng.below(256));
                let piece = &other[a..(a + len).min(other.len())];
                let at = rng.below(n + 1);
                let end = (at + rng.below(piece.len() + 1)).min(n);
                v.splice(at..end, piece.iter().copied());
            }
            3 if n >= 4 => {
                const EDGES: [u32; 8] = [0, 1, 0x7F, 0xFF, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFE, 0xFFFF_FFFF];
                let x = EDGES[rng.below(EDGES.len())];
                let b = if rng.below(2) == 0 { x.to_le_bytes() } else { x.to_be_bytes() };
                let i = rng.below(n - 3);
                v[i..i + 4].copy_from_slice(&b);
            }
            4 => {
                let at = rng.below(n + 1);
                let byte = if rng.below(2) == 0 { 0xFF } else { rng.next_u64() as u8 };
                let run = 1 + rng.below(64);
                v.splice(at..at, std::iter::repeat_n(byte, run));
            }
            _ if n > 0 => {
                let a = rng.below(n);
                let b = (a + 1 + rng.below(64)).min(n);
                v.drain(a..b);
            }
            _ => {}
        }
    }
    v
}

/// The committed corpus of `target`: (file name, bytes), by name.
fn read_corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).map(|e| e.unwrap().path()).collect();
    files.sort();
    files.into_iter().map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap())).collect()
}

/// Runs `f` on every seed and `per_seed` mutations of each; panics listing every input that
/// failed (saved under the target dir for a rerun).
fn replay(target: &str, seeds: &[(String, Vec<u8>)], per_seed: usize, f: fn(&[u8])) {
    assert!(!seeds.is_empty(), "{target}: no corpus");
    let mut rng = Rng::new(0x6D6F_6765_0000_0001 ^ (target.len() as u64 * 0x9E37_79B9));
    let mut faults = Vec::new();
    let mut ran = 0usize;
    let check = |name: String, input: Vec<u8>, faults: &mut Vec<String>| {
        let t = Instant::now();
        let result = std::panic::catch_unwind(|| f(&input));
        let took = t.elapsed();
        let fault = match result {
            Err(e) => Some(format!(
                "panicked: {}",
                e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
            )),
            Ok(()) if took > SLOW => Some(format!("took {took:?}")),
            Ok(()) if LARGEST.load(Ordering::Relaxed) > MAX_ALLOC => Some(format!("asked for {} bytes at once", LARGEST.swap(0, Ordering::Relaxed))),
            Ok(()) => None,
        };
        if let Some(why) = fault {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-replay").join(target);
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(format!("{}.bin", faults.len()));
            std::fs::write(&path, &input).unwrap();
            faults.push(format!("{name} ({} bytes, saved as {}): {why}", input.len(), path.display()));
        }
    };
    for (name, seed) in seeds {
        check(name.clone(), seed.clone(), &mut faults);
        ran += 1;
    }
    for (i, (name, seed)) in seeds.iter().enumerate() {
        let other = &seeds[(i + 1 + rng.below(seeds.len())) % seeds.len()].1;
        for k in 0..per_seed {
            let m = mutate(&mut rng, seed, other);
            check(format!("{name} mutation {k}"), m, &mut faults);
            ran += 1;
        }
    }
    assert!(faults.is_empty(), "{target}: {} of {ran} inputs failed:\n{}", faults.len(), faults.join("\n"));
    eprintln!("{target}: {ran} inputs, no fault");
}

#[test]
fn decode() {
    if !own_process("fuzz_replay::decode", &[]) {
        return;
    }
    replay("decode", &read_corpus("decode"), 200, targets::decode);
}

#[test]
fn checkpoint_pt() {
    if !own_process("fuzz_replay::checkpoint_pt", &[]) {
        return;
    }
    let mut seeds = read_corpus("checkpoint_pt");
    replay("checkpoint_pt", &seeds, 400, targets::checkpoint_pt);
    // Real fixtures, full size of their kind: fewer mutations, each is a whole archive.
    seeds = ["random_normal.pt", "tiny_normal_bf16.pt"].iter().map(|n| (n.to_string(), std::fs::read(fixtures().join(n)).unwrap())).collect();
    replay("checkpoint_pt_fixtures", &seeds, 25, targets::checkpoint_pt);
}

#[test]
fn checkpoint_pickle() {
    if !own_process("fuzz_replay::checkpoint_pickle", &[]) {
        return;
    }
    replay("checkpoint_pickle", &read_corpus("checkpoint_pickle"), 800, targets::checkpoint_pickle);
}

#[test]
fn checkpoint_safetensors() {
    if !own_process("fuzz_replay::checkpoint_safetensors", &[]) {
        return;
    }
    replay("checkpoint_safetensors", &read_corpus("checkpoint_safetensors"), 1500, targets::checkpoint_safetensors);
}

#[test]
fn hub_head() {
    if !own_process("fuzz_replay::hub_head", &[]) {
        return;
    }
    replay("hub_head", &read_corpus("hub_head"), 600, targets::hub_head);
}

#[test]
fn the_mutations_reach_past_the_format_checks() {
    // A replay that only ever hit "not an image" would prove little: some mutated photos
    // must still decode, and some must fail deeper than the format sniffing.
    let seeds = read_corpus("decode");
    let mut rng = Rng::new(7);
    let (mut decoded, mut deep_errors) = (0, 0);
    for (_, s) in &seeds {
        for _ in 0..20 {
            let m = mutate(&mut rng, s, &seeds[0].1);
            match moge::image_io::decode_bytes(&m, &Default::default()) {
                Ok(_) => decoded += 1,
                Err(e) if !e.to_string().contains("not an image") => deep_errors += 1,
                Err(_) => {}
            }
        }
    }
    assert!(decoded > 20 && deep_errors > 100, "decoded {decoded}, deep errors {deep_errors}");
}

#[test]
#[should_panic(expected = "panicked: a length the mutations reach")]
fn the_replay_reports_a_target_that_panics() {
    fn fragile(data: &[u8]) {
        assert!(data.len() != 3, "a length the mutations reach");
    }
    replay("self_check", &[("seed".into(), b"abcdefgh".to_vec())], 200, fragile);
}
