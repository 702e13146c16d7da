//! Running the `moge` binary of this build.

use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

/// `moge`, to add arguments to.
pub fn moge() -> Command {
    of_this_build(env!("CARGO_BIN_EXE_moge"))
}

/// What runs a program of this build's target: `MOGE_TEST_RUNNER` when set (a command and its
/// arguments, split at spaces: `qemu-aarch64-static -L /usr/aarch64-linux-gnu` for an aarch64
/// build tested on x86-64, where the kernel cannot exec it), else the program itself.
pub fn of_this_build(program: impl AsRef<std::ffi::OsStr>) -> Command {
    match std::env::var("MOGE_TEST_RUNNER").ok().filter(|r| !r.trim().is_empty()) {
        Some(runner) => {
            let mut words = runner.split_whitespace();
            let mut c = Command::new(words.next().expect("a runner is not empty"));
            c.args(words).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// `moge ARGS`, run to its end.
pub fn run(args: &[&str]) -> Output {
    moge().args(args).output().expect("run moge")
}

/// Waits for `child` at most `limit`; past it, kills it and fails naming `what`.
pub fn wait_bounded(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
