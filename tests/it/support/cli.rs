//! Running the `moge` binary of this build.

use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

/// `moge`, to add arguments to.
pub fn moge() -> Command {
    Command::new(env!("CARGO_BIN_EXE_moge"))
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
