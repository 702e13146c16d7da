//! `moge serve` as a child process: started on a free port of 127.0.0.1 with the tiny fixture
//! model, its ready line waited for (bounded), killed when dropped.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::cli::{moge, wait_bounded};
use super::paths::fixtures;

pub struct Server {
    pub child: Child,
    pub url: String,
    pub addr: String,
}

impl Server {
    /// Starts `moge serve` with the tiny MoGe-2 fixture model and waits (at most 60 s) for its ready line.
    pub fn start(extra: &[&str]) -> Server {
        Self::start_with(&fixtures().join("tiny_normal.pt"), extra)
    }

    /// The same with the model of `weights`.
    pub fn start_with(weights: &std::path::Path, extra: &[&str]) -> Server {
        let port = if extra.contains(&"--port") { &[][..] } else { &["--port", "0"][..] };
        let mut child = moge()
            .args(["serve", "--precision", "f32", "--weights"])
            .arg(weights)
            .args(port)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| {
            let _ = child.kill();
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            panic!("no ready line from moge serve; stderr: {err}")
        });
        let url = line.strip_prefix("moge: listening on ").unwrap_or_else(|| panic!("ready line: {line:?}")).to_owned();
        let addr = url.strip_prefix("http://").unwrap().to_owned();
        Server { child, url, addr }
    }

    pub fn sigterm(&self) {
        // SAFETY: kill takes no pointers; the pid is the server's, our child, which only `wait`
        // reaps and no test signals after that, so it names no other process.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
    }

    /// The exit status, waiting at most `limit`.
    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        wait_bounded(&mut self.child, limit, "moge serve")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
