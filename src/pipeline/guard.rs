//! Panics inside one image's work become that image's error, never the end of a batch or
//! of the server.

use std::cell::Cell;

use anyhow::{anyhow, Result};

thread_local! {
    static IN_GUARD: Cell<bool> = const { Cell::new(false) };
}

/// Panics inside guarded stage work become errors of that image; silence the default
/// report for those (the image's error line says it), keep it for anything else.
pub fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_GUARD.with(|g| g.get()) {
                prev(info)
            }
        }));
    });
}

pub fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch(f).unwrap_or_else(|msg| Err(anyhow!("internal error: {msg}")))
}

/// Runs `f`, a panic in it returned as its message.
pub fn catch<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    // Nested guards (a binding's around the library's) leave the outer one in force.
    let outer = IN_GUARD.with(|g| g.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    IN_GUARD.with(|g| g.set(outer));
    r.map_err(|p| p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "unknown panic".into()))
}
