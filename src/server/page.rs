//! `GET /`: the web page, upstream's `moge app` without Python. Its files are compiled into
//! the binary, so that it works offline and needs no other server; it calls `POST /predict` and
//! `GET /info` like any client, and does the rest in the browser (page/README.md).

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The page's files: name, media type, contents.
const FILES: &[(&str, &str, &str)] = &[
    ("index.html", "text/html; charset=utf-8", include_str!("page/index.html")),
    ("style.css", "text/css; charset=utf-8", include_str!("page/style.css")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("page/app.js")),
    ("npz.js", "text/javascript; charset=utf-8", include_str!("page/npz.js")),
    ("maps.js", "text/javascript; charset=utf-8", include_str!("page/maps.js")),
    ("surface.js", "text/javascript; charset=utf-8", include_str!("page/surface.js")),
    ("export.js", "text/javascript; charset=utf-8", include_str!("page/export.js")),
    ("viewer.js", "text/javascript; charset=utf-8", include_str!("page/viewer.js")),
];

/// Everything from this server, nothing from elsewhere: the photo and the results live in the
/// page as blob: URLs.
const CSP: &str = "default-src 'self'; img-src 'self' blob: data:; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

pub async fn index() -> Response {
    file("index.html")
}

pub async fn asset(Path(name): Path<String>) -> Response {
    if name == "index.html" {
        // One address for the page: `/`.
        return (StatusCode::NOT_FOUND, "not found").into_response();
    }
    file(&name)
}

fn file(name: &str) -> Response {
    let Some(&(_, media, body)) = FILES.iter().find(|(n, _, _)| *n == name) else {
        return (StatusCode::NOT_FOUND, "not found").into_response();
    };
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(media));
    // The files change with the binary: a browser asks again each time (a 304 would need an ETag
    // per build; they are small).
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_the_page_imports_is_served() {
        // An import of a file missing from FILES would only fail in a browser.
        for (name, _, body) in FILES {
            for line in body.lines() {
                let Some(rest) = line.split(" from \"./").nth(1) else { continue };
                let target = rest.split('"').next().unwrap();
                assert!(FILES.iter().any(|(n, _, _)| *n == target), "{name} imports {target}, which is not served");
            }
        }
        let html = FILES[0].2;
        for (name, _, _) in &FILES[1..] {
            let linked = html.contains(&format!("/page/{name}")) || FILES.iter().any(|(_, _, b)| b.contains(&format!("\"./{name}\"")));
            assert!(linked, "{name} is served but nothing loads it");
        }
    }
}
