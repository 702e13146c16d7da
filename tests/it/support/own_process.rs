//! Tests that need a process of their own: what is set once per process (the switch to candle's
//! generic ops, `MOGE_GENERIC_OPS`, read at the first model call) or counted over a whole process
//! (the fuzz replay's largest allocation, the peak memory a spawned `moge` inherits in its
//! count) would otherwise mix with the other tests of this binary.

/// Set in the process started for one test: that test's path.
const CHILD: &str = "MOGE_TEST_OWN_PROCESS";

/// Whether the calling test, whose path in this binary is `name` (`module::function`), runs its
/// body here: true in the process started for it. Anywhere else, runs that test alone in a new
/// process of this binary with `env` set, fails if it fails there (its output becomes this
/// test's), and returns false.
pub fn own_process(name: &str, env: &[(&str, &str)]) -> bool {
    if std::env::var(CHILD).is_ok_and(|v| v == name) {
        return true;
    }
    let out = super::cli::of_this_build(std::env::current_exe().unwrap())
        .args([name, "--exact", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD, name)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    // A name that matches no test would pass with nothing run.
    assert!(out.status.success() && stdout.contains("test result: ok. 1 passed"), "{name}, in a process of its own: {}", out.status);
    false
}
