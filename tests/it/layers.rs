//! The crate's layering, read from its sources: what each file imports (`crate::` and `super::`
//! paths, outside comments, strings and unit tests) resolved to the file that defines it. No
//! two files import each other, directly or round a loop; the SIMD layer imports nothing above
//! it; nothing outside the model reaches into its CPU kernels; the model does not import the
//! post-processing, the outputs or the pipeline.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's file relative to src/ (`model/v2.rs`, `model/mod.rs`), from its path segments.
fn module_file(src: &Path, segments: &[&str]) -> Option<String> {
    let dir: PathBuf = segments.iter().collect();
    let candidates = if segments.is_empty() { vec![PathBuf::from("lib.rs")] } else { vec![dir.with_extension("rs"), dir.join("mod.rs")] };
    candidates.into_iter().find(|c| src.join(c).is_file()).map(|c| c.to_string_lossy().into_owned())
}

/// The module path of a file (`model/v2.rs` -> [model, v2]).
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file.trim_end_matches(".rs").split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The text without comments, string literals and `#[cfg(test)] mod tests { ... }` at the end.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if c == '"' && !escaped {
                        break;
                    }
                    escaped = c == '\\' && !escaped;
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    out
}

/// Every file's imports, as files.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_owned()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p.strip_prefix(src).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let path = regex_free_paths;
    let mut out = BTreeMap::new();
    for file in files {
        // The binary's command line sits above everything by design.
        if file == "main.rs" || file.starts_with("cli/") {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(src.join(&file)).unwrap());
        let here = module_of(&file);
        let mut deps = BTreeSet::new();
        for p in path(&code) {
            let mut segs: Vec<&str> = p.split("::").collect();
            let base: Vec<String> = match segs.first() {
                Some(&"crate") | Some(&"$crate") => {
                    segs.remove(0);
                    vec![]
                }
                Some(&"super") => {
                    // `super` of a file `a/b.rs` is `a`; of `a/b/mod.rs` also `a`.
                    let mut b = here.clone();
                    while segs.first() == Some(&"super") {
                        segs.remove(0);
                        b.pop();
                    }
                    b
                }
                _ => continue,
            };
            // The longest prefix that is a module file.
            let mut found = None;
            for n in (0..=segs.len()).rev() {
                let all: Vec<&str> = base.iter().map(String::as_str).chain(segs[..n].iter().copied()).collect();
                if let Some(f) = module_file(src, &all) {
                    found = Some(f);
                    break;
                }
            }
            if let Some(f) = found.filter(|f| *f != file) {
                deps.insert(f);
            }
        }
        out.insert(file, deps);
    }
    out
}

/// The `crate::a::b`, `$crate::a` and `super::a` paths of a text.
fn regex_free_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'$';
    let mut i = 0;
    while i < bytes.len() {
        if (i == 0 || !word(bytes[i - 1])) && (code[i..].starts_with("crate::") || code[i..].starts_with("$crate::") || code[i..].starts_with("super::")) {
            let start = i;
            while i < bytes.len() && (word(bytes[i]) || code[i..].starts_with("::")) {
                i += if code[i..].starts_with("::") { 2 } else { 1 };
            }
            out.push(code[start..i].trim_end_matches("::").to_owned());
        } else {
            i += 1;
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// A module's own `mod.rs` is its parent: a file may use what its parent defines, and the
/// parent declares and re-exports its files; those edges are not layering.
fn is_ancestor(parent: &str, child: &str) -> bool {
    parent == "lib.rs" || (parent.ends_with("mod.rs") && child.starts_with(parent.trim_end_matches("mod.rs")))
}

#[test]
fn no_two_files_import_each_other_round_a_loop() {
    let g = graph();
    assert!(g.len() > 50, "only {} files read", g.len());
    // Depth-first search for a back edge, reporting the loop.
    fn visit(f: &str, g: &dyn Fn(&str) -> Vec<String>, stack: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == f) {
            return Some(stack[i..].iter().cloned().chain([f.to_owned()]).collect());
        }
        if done.contains(f) {
            return None;
        }
        stack.push(f.to_owned());
        for t in g(f) {
            if let Some(l) = visit(&t, g, stack, done) {
                return Some(l);
            }
        }
        stack.pop();
        done.insert(f.to_owned());
        None
    }
    let next = |f: &str| g.get(f).into_iter().flatten().filter(|t| !is_ancestor(t, f) && !is_ancestor(f, t)).cloned().collect::<Vec<_>>();
    let mut done = BTreeSet::new();
    for f in g.keys() {
        if let Some(l) = visit(f, &next, &mut vec![], &mut done) {
            panic!("an import loop: {}", l.join(" -> "));
        }
    }
}

#[test]
fn the_simd_layer_imports_nothing_above_it_and_the_kernels_stay_in_the_model() {
    let g = graph();
    for (file, deps) in &g {
        for d in deps {
            if file.starts_with("simd/") {
                assert!(d.starts_with("simd/") || d == "console.rs" || d == "lib.rs", "{file} imports {d}, above the SIMD layer");
            }
            if !file.starts_with("model/") {
                assert!(!d.starts_with("model/cpu/"), "{file} reaches into the model's CPU kernels ({d})");
            }
            if file.starts_with("model/") {
                let up = ["infer.rs", "outputs/", "pipeline/", "server/", "remote/", "protocol.rs", "fit.rs", "loader.rs"];
                assert!(!up.iter().any(|u| d.starts_with(u)), "{file} imports {d}, above the model");
            }
        }
    }
    assert!(g["infer.rs"].contains("model/v2.rs") || g["infer.rs"].contains("model/mod.rs"), "the reading missed infer.rs -> model: {:?}", g["infer.rs"]);
}
