//! The crate's layering, read from its sources: what each file imports (`crate::` and `super::`
//! paths, `{ ... }` groups included, outside comments, strings and unit tests) resolved to the
//! file that defines it. A name a `mod.rs` or `lib.rs` re-exports (`pub use`) counts as an
//! import of the file that defines it, so `use crate::Model` is held to the layering as
//! `use crate::model::v2::Model` is. No two files import each other, directly or round a loop;
//! the SIMD layer imports nothing above it; nothing outside the model reaches into its CPU
//! kernels; the model does not import the post-processing, the outputs or the pipeline; and
//! the library's own code imports from the defining path, not through the crate root's
//! re-exports (those are the face for programs using the crate).

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

/// Every `.rs` file under `src`, relative to it.
fn files(src: &Path) -> Vec<String> {
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
    files.sort();
    files
}

/// A `use` tree's leaves with the prefix before them: `a::{b, c::{d, e as f}}` gives `a::b`,
/// `a::c::d` and `a::c::e as f`.
fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    let join = |rest: &str| {
        if prefix.is_empty() {
            rest.to_owned()
        } else if rest.is_empty() {
            prefix.to_owned()
        } else {
            format!("{prefix}::{rest}")
        }
    };
    match tree.find('{') {
        Some(open) if tree.ends_with('}') => {
            let head = tree[..open].trim().trim_end_matches("::");
            let inner = &tree[open + 1..tree.len() - 1];
            let (mut depth, mut from) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&join(head), &inner[from..i], out);
                        from = i + 1;
                    }
                    _ => {}
                }
            }
            expand(&join(head), &inner[from..], out);
        }
        _ if tree.is_empty() => {}
        // `self` in a group is the group's own path.
        _ if tree == "self" => out.push(prefix.to_owned()),
        _ => out.push(join(tree)),
    }
}

/// The `crate::a::b`, `$crate::a` and `super::a` paths of a text, `{ ... }` groups after them
/// expanded to one path per leaf (`as` renames dropped).
fn paths(code: &str) -> Vec<String> {
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
            let path = &code[start..i];
            if path.ends_with("::") && code[i..].starts_with('{') {
                // The group up to its closing brace.
                let mut depth = 0;
                let mut end = i;
                for (j, c) in code[i..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    if depth == 0 {
                        end = i + j + 1;
                        break;
                    }
                }
                let mut leaves = Vec::new();
                expand(path.trim_end_matches("::"), &code[i..end], &mut leaves);
                out.extend(leaves.into_iter().map(|l| l.split(" as ").next().unwrap().trim().to_owned()));
                i = end;
            } else {
                out.push(path.trim_end_matches("::").to_owned());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// A path's segments as seen from the module `here`: `crate::` from the root, `super::` from
/// the parent, anything else (a `use` in a `mod.rs` naming a child) from `here`.
fn absolute(here: &[String], path: &str) -> Vec<String> {
    let mut segs: Vec<&str> = path.split("::").map(str::trim).collect();
    let mut base: Vec<String> = match segs.first() {
        Some(&"crate") | Some(&"$crate") => {
            segs.remove(0);
            vec![]
        }
        Some(&"self") => {
            segs.remove(0);
            here.to_vec()
        }
        Some(&"super") => here.to_vec(),
        _ => here.to_vec(),
    };
    // `super` of a file `a/b.rs` is `a`; of `a/b/mod.rs` also `a`.
    while segs.first() == Some(&"super") {
        segs.remove(0);
        base.pop();
    }
    base.extend(segs.into_iter().map(str::to_owned));
    base
}

/// The source tree read: every file's imports as files, and the imports made through the
/// crate root's re-exports.
struct Tree {
    imports: BTreeMap<String, BTreeSet<String>>,
    /// (file, path) of each `crate::X` where `X` is a name `lib.rs` re-exports.
    through_root: Vec<(String, String)>,
}

impl Tree {
    fn read(src: &Path) -> Tree {
        let files = files(src);
        let code: BTreeMap<String, String> = files.iter().map(|f| (f.clone(), code_of(&std::fs::read_to_string(src.join(f)).unwrap()))).collect();
        // What each `lib.rs` / `mod.rs` re-exports: (file, name) -> the absolute path it names.
        let mut reexports: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for (file, text) in code.iter().filter(|(f, _)| *f == "lib.rs" || f.ends_with("mod.rs")) {
            let here = module_of(file);
            for stmt in text.split(';') {
                let stmt = stmt.trim_start();
                let Some(tree) = stmt.strip_prefix("pub use ").or_else(|| stmt.strip_prefix("pub(crate) use ")) else { continue };
                let mut leaves = Vec::new();
                expand("", tree, &mut leaves);
                for leaf in leaves {
                    let (path, name) = match leaf.split_once(" as ") {
                        Some((p, n)) => (p.trim().to_owned(), n.trim().to_owned()),
                        None => (leaf.clone(), leaf.rsplit("::").next().unwrap().trim().to_owned()),
                    };
                    let abs = absolute(&here, &path);
                    // Another crate's item (`pub use candle_core::Device`): not a file of ours.
                    let child = abs.len() > here.len() && module_file(src, &abs[..=here.len()].iter().map(String::as_str).collect::<Vec<_>>()).is_some();
                    let ours = child || ["crate::", "super::", "self::"].iter().any(|p| path.starts_with(p));
                    if ours && name != "*" {
                        reexports.insert((file.clone(), name), abs);
                    }
                }
            }
        }
        // The file that defines the item at `segs`: the longest prefix that is a module file,
        // then through its re-exports while the next segment is one of them.
        let resolve = |segs: &[String]| -> Option<String> {
            let mut segs = segs.to_vec();
            for _ in 0..8 {
                let n = (0..=segs.len()).rev().find(|&n| module_file(src, &segs[..n].iter().map(String::as_str).collect::<Vec<_>>()).is_some())?;
                let f = module_file(src, &segs[..n].iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
                match segs.get(n).and_then(|name| reexports.get(&(f.clone(), name.clone()))) {
                    Some(target) if target[..] != segs[..n + 1] => segs = target.iter().cloned().chain(segs[n + 1..].iter().cloned()).collect(),
                    _ => return Some(f),
                }
            }
            None
        };
        let mut imports = BTreeMap::new();
        let mut through_root = Vec::new();
        for (file, text) in &code {
            // The binary's command line sits above everything by design.
            if file == "main.rs" || file.starts_with("cli/") {
                continue;
            }
            let here = module_of(file);
            let mut deps = BTreeSet::new();
            for p in paths(text) {
                let abs = absolute(&here, &p);
                if file != "lib.rs" && (p.starts_with("crate::") || p.starts_with("$crate::")) {
                    if let Some(first) = abs.first().filter(|s| module_file(src, &[s.as_str()]).is_none()) {
                        if reexports.contains_key(&("lib.rs".to_owned(), first.clone())) {
                            through_root.push((file.clone(), p.clone()));
                        }
                    }
                }
                if let Some(f) = resolve(&abs).filter(|f| f != file) {
                    deps.insert(f);
                }
            }
            imports.insert(file.clone(), deps);
        }
        Tree { imports, through_root }
    }

    /// The first import loop found, as the files round it.
    fn import_loop(&self) -> Option<Vec<String>> {
        let g = &self.imports;
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
        g.keys().find_map(|f| visit(f, &next, &mut vec![], &mut done))
    }

    /// Every import that crosses a layer the wrong way.
    fn layer_violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (file, deps) in &self.imports {
            for d in deps {
                if file.starts_with("simd/") && !(d.starts_with("simd/") || d == "console.rs" || d == "lib.rs") {
                    out.push(format!("{file} imports {d}, above the SIMD layer"));
                }
                if !file.starts_with("model/") && d.starts_with("model/cpu/") {
                    out.push(format!("{file} reaches into the model's CPU kernels ({d})"));
                }
                let up = ["infer.rs", "outputs/", "pipeline/", "server/", "remote/", "protocol.rs", "fit.rs", "loader.rs"];
                if file.starts_with("model/") && up.iter().any(|u| d.starts_with(u)) {
                    out.push(format!("{file} imports {d}, above the model"));
                }
            }
        }
        out
    }
}

fn tree() -> Tree {
    Tree::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// A module's own `mod.rs` is its parent: a file may use what its parent defines, and the
/// parent declares and re-exports its files; those edges are not layering.
fn is_ancestor(parent: &str, child: &str) -> bool {
    parent == "lib.rs" || (parent.ends_with("mod.rs") && child.starts_with(parent.trim_end_matches("mod.rs")))
}

#[test]
fn no_two_files_import_each_other_round_a_loop() {
    let t = tree();
    assert!(t.imports.len() > 50, "only {} files read", t.imports.len());
    if let Some(l) = t.import_loop() {
        panic!("an import loop: {}", l.join(" -> "));
    }
}

#[test]
fn the_simd_layer_imports_nothing_above_it_and_the_kernels_stay_in_the_model() {
    let t = tree();
    let wrong = t.layer_violations();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let infer = &t.imports["infer.rs"];
    assert!(infer.contains("model/v2.rs") || infer.contains("model/mod.rs"), "the reading missed infer.rs -> model: {infer:?}");
}

#[test]
fn the_library_imports_from_the_defining_path_not_the_crate_root() {
    let t = tree();
    let wrong: Vec<String> = t.through_root.iter().map(|(f, p)| format!("{f}: {p}")).collect();
    assert!(wrong.is_empty(), "imports through lib.rs's re-exports (import from the module that defines the item):\n{}", wrong.join("\n"));
}

/// The reading itself, on a copy of src/ with imports planted in the SIMD layer: one through
/// the crate root (`use crate::Model`), one in a `{ ... }` group through a `mod.rs`'s re-export.
/// Each is caught as an import of the file that defines the item, and the untouched copy reads
/// as clean as the tree.
#[test]
fn imports_through_re_exports_and_groups_are_held_to_the_layering() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let copy = tempfile::tempdir().unwrap();
    for f in files(&src) {
        let to = copy.path().join(&f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(src.join(&f), to).unwrap();
    }
    assert_eq!(Tree::read(copy.path()).layer_violations(), Vec::<String>::new(), "the copy reads as the tree");

    let plant = |file: &str, line: &str| {
        let p = copy.path().join(file);
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, format!("{line}\n{text}")).unwrap();
    };
    plant("simd/mod.rs", "use crate::Model;");
    plant("simd/math.rs", "use crate::{console, model::{Precision, config::ModelConfig as C}};");
    let t = Tree::read(copy.path());
    let wrong = t.layer_violations();
    let model_file = t.imports["simd/mod.rs"].iter().find(|d| d.starts_with("model/")).cloned();
    assert_eq!(model_file.as_deref(), Some("model/v2.rs"), "crate::Model is model/v2.rs's (through lib.rs and model/mod.rs): {wrong:?}");
    for expected in [
        "simd/mod.rs imports model/v2.rs, above the SIMD layer",
        "simd/math.rs imports model/mod.rs, above the SIMD layer",
        "simd/math.rs imports model/config.rs, above the SIMD layer",
    ] {
        assert!(wrong.iter().any(|w| w == expected), "missing {expected:?} in {wrong:?}");
    }
    assert!(!wrong.iter().any(|w| w.contains("console.rs")), "console is allowed below: {wrong:?}");
    let planted: Vec<_> = t.through_root.iter().filter(|(f, _)| f.starts_with("simd/")).collect();
    assert_eq!(planted, [&("simd/mod.rs".to_owned(), "crate::Model".to_owned())], "the one import through the crate root");
}
