//! Lines for stdout and stderr that never panic. `println!` panics when the reader has gone
//! (`moge predict *.jpg | head -1`, `moge batch dir 2>&1 | head`); for a command line a closed
//! pipe is not an error: printing stops quietly and the work goes on to its normal end (the
//! files are the product, the lines only report them), with the usual exit status.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `args` and a newline to stdout; false once stdout is closed.
pub fn out(args: std::fmt::Arguments) -> bool {
    match write_line(&mut std::io::stdout().lock(), &STDOUT_CLOSED, args) {
        Ok(written) => written,
        Err(e) => {
            // Not a reader that left: a full disk behind `> file`, say. Said once, on stderr.
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                err(format_args!("moge: cannot write to standard output ({e}); its lines stop here"));
            }
            false
        }
    }
}

/// Writes `args` and a newline to stderr; false once stderr is closed.
pub fn err(args: std::fmt::Arguments) -> bool {
    write_line(&mut std::io::stderr().lock(), &STDERR_CLOSED, args).unwrap_or(false)
}

/// Ok(false) when the stream was closed before; the first failure (EPIPE, EBADF, a full disk
/// behind a redirect) closes it and is returned. The work is not stopped for it.
fn write_line(w: &mut impl Write, closed: &AtomicBool, args: std::fmt::Arguments) -> std::io::Result<bool> {
    if closed.load(Ordering::Relaxed) {
        return Ok(false);
    }
    match w.write_fmt(args).and_then(|_| w.write_all(b"\n")).and_then(|_| w.flush()) {
        Ok(()) => Ok(true),
        Err(e) => {
            closed.store(true, Ordering::Relaxed);
            Err(e)
        }
    }
}

/// The error chain on one line, leaving out causes whose text the line already ends with
/// (the image crate repeats its source in its own message).
pub fn error_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// A line the library has to say beside its results (a video cut short, a depth video not
/// written, a server out of a pool): handed to whoever prints (the command line writes
/// `moge: {notice}` on stderr), never printed by the library itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Something was wrong and the work went on.
    Warning(String),
    /// Something failed (an output not written).
    Error(String),
    /// Neither: how the work was done (a server back in a pool, a camera matrix's unused terms).
    Info(String),
}

impl Notice {
    /// The text without its kind.
    pub fn text(&self) -> &str {
        match self {
            Notice::Warning(t) | Notice::Error(t) | Notice::Info(t) => t,
        }
    }
}

/// `warning: TEXT` for a warning, the text alone for the others.
impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Notice::Warning(t) => write!(f, "warning: {t}"),
            Notice::Error(t) | Notice::Info(t) => f.write_str(t),
        }
    }
}

/// Where a long-lived part of the library (a pool's probe thread) hands its notices; the
/// default drops them.
pub type NoticeSink = std::sync::Arc<dyn Fn(Notice) + Send + Sync>;

/// `println!` that stops quietly on a closed stdout.
#[macro_export]
macro_rules! outln {
    () => {{ let _ = $crate::console::out(format_args!("")); }};
    ($($t:tt)*) => {{ let _ = $crate::console::out(format_args!($($t)*)); }};
}

/// `eprintln!` that stops quietly on a closed stderr.
#[macro_export]
macro_rules! errln {
    () => {{ let _ = $crate::console::err(format_args!("")); }};
    ($($t:tt)*) => {{ let _ = $crate::console::err(format_args!($($t)*)); }};
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Closed;
    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_stream_stops_printing_without_panic() {
        let flag = AtomicBool::new(false);
        assert_eq!(write_line(&mut Closed, &flag, format_args!("a {}", 1)).unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);
        assert!(flag.load(Ordering::Relaxed));
        let mut v = Vec::new();
        assert!(!write_line(&mut v, &flag, format_args!("b")).unwrap(), "stays closed");
        assert!(v.is_empty());
        let open = AtomicBool::new(false);
        assert!(write_line(&mut v, &open, format_args!("c {}", 2)).unwrap());
        assert_eq!(v, b"c 2\n");
    }
}
