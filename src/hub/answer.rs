//! What the hub's answers mean: the headers of the `HEAD` on a file's `resolve` URL, and the
//! `Content-Range` of a resumed download. Pure functions over the header values, so that what a
//! server (or anything pretending to be one) sends can be fuzzed without a network.

/// What a `HEAD` answer says.
#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    /// A relative redirect on the hub (a renamed repo): ask again at this URL.
    Redirect(String),
    /// The file: its sha256 (or other ETag), the commit it resolves to, its size.
    File { etag: String, commit: String, size: u64 },
    /// An HTTP error status.
    Status(u16),
    /// An answer that lacks something or carries names that are not plain (what, in words).
    Bad(String),
}

/// Blob names and commits from the server become file names: keep them plain.
pub fn is_safe_name(s: &str) -> bool {
    !s.is_empty() && !s.starts_with('.') && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// `huggingface_hub`'s ETag normalisation: drop a weak marker and the quotes.
pub fn clean_etag(v: &str) -> String {
    v.trim().trim_start_matches("W/").trim_matches('"').to_string()
}

/// `scheme://host[:port]` of `url` + an absolute path.
pub fn join_origin(url: &str, path: &str) -> String {
    let origin_end = url.find("://").and_then(|i| url[i + 3..].find('/').map(|j| i + 3 + j)).unwrap_or(url.len());
    format!("{}{path}", &url[..origin_end])
}

/// Reads a `HEAD` answer for `url`; `header` gives a header's value by lower-case name.
pub fn read_head<'a>(url: &str, status: u16, header: impl Fn(&str) -> Option<&'a str>) -> Head {
    let header = |name: &str| header(name).map(str::trim).filter(|v| !v.is_empty());
    if (300..400).contains(&status) {
        if let Some(location) = header("location").filter(|l| l.starts_with('/')) {
            return Head::Redirect(join_origin(url, location));
        }
    }
    if status >= 400 {
        return Head::Status(status);
    }
    let Some(commit) = header("x-repo-commit") else { return Head::Bad("without an X-Repo-Commit header".into()) };
    let Some(etag) = header("x-linked-etag").or_else(|| header("etag")).map(clean_etag) else {
        return Head::Bad("without an ETag header".into());
    };
    let Some(size) = header("x-linked-size").or_else(|| header("content-length")).and_then(|s| s.parse::<u64>().ok()) else {
        return Head::Bad("without the file size (X-Linked-Size or Content-Length)".into());
    };
    if !is_safe_name(commit) || !is_safe_name(&etag) {
        return Head::Bad(format!("with a commit '{commit}' or ETag '{etag}' that is not a plain name"));
    }
    Head::File { etag, commit: commit.to_owned(), size }
}

/// Whether a `206` answer's `Content-Range` continues at byte `have`, as asked.
pub fn range_continues(content_range: Option<&str>, have: u64) -> bool {
    content_range.unwrap_or("").trim().starts_with(&format!("bytes {have}-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(status: u16, h: &[(&str, &str)]) -> Head {
        read_head("http://hub.test/r/resolve/main/model.pt", status, |n| h.iter().find(|(k, _)| *k == n).map(|(_, v)| *v))
    }

    #[test]
    fn answers_read_as_huggingface_hub_reads_them() {
        let sha = "a".repeat(64);
        let ok = [("x-repo-commit", "0123abcd"), ("x-linked-etag", "\"AAAA\""), ("x-linked-size", "42"), ("etag", "W/\"x\"")];
        assert_eq!(head(200, &ok), Head::File { etag: "AAAA".into(), commit: "0123abcd".into(), size: 42 });
        let fallback = [("x-repo-commit", "c"), ("etag", &*format!("W/\"{sha}\"")), ("content-length", "7")];
        assert_eq!(head(200, &fallback), Head::File { etag: sha.clone(), commit: "c".into(), size: 7 });
        assert_eq!(head(307, &[("location", "/new/resolve/main/model.pt")]), Head::Redirect("http://hub.test/new/resolve/main/model.pt".into()));
        assert_eq!(head(404, &[]), Head::Status(404));
        assert!(matches!(head(302, &[("location", "https://elsewhere/x")]), Head::Bad(_)), "absolute redirects are not followed here");
        assert!(matches!(head(200, &[("x-repo-commit", "../../etc"), ("etag", "e"), ("content-length", "1")]), Head::Bad(_)));
        assert!(matches!(head(200, &[("x-repo-commit", "c"), ("etag", "e"), ("content-length", "-1")]), Head::Bad(_)));
    }

    #[test]
    fn content_range_must_continue_where_asked() {
        assert!(range_continues(Some("bytes 100-199/200"), 100));
        assert!(!range_continues(Some("bytes 0-199/200"), 100));
        assert!(!range_continues(None, 100));
    }
}
