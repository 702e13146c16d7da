//! What a client of a pool of servers costs and gains, with `moge batch --server` as users run it.
//!
//! ```text
//! cargo run --release --example pool_bench -- fanout --moge target/release/moge [--photos 48] [--delay-ms 200] [--rounds 3]
//! cargo run --release --example pool_bench -- client --moge target/release/moge --weights tests/fixtures/tiny_normal.pt [--photos 12] [--format npz]
//! ```
//!
//! `fanout`: stand-in servers (separate processes, each answering after a fixed delay with a
//! made-up prediction of the photo's size; `tests/it/support/stand_in.rs`) in pools of 1, 2, 4 and
//! 8, one request in flight each, the pool sizes alternated round by round; prints each pool's
//! median wall time, its speedup over one server and the efficiency (speedup / servers).
//!
//! `client`: 1920x1080 JPEG photos through `moge batch --server`, once to a stand-in that answers
//! at once (the client alone) and once to a real `moge serve` on loopback; prints the client
//! process's CPU time per photo (decode, send, receive, write: its own cost, from getrusage of the
//! child) and its wall time per photo. One client core then feeds 1000 / (CPU ms per photo) photos
//! per second.

// The tests' stand-in server and the loopback server under it; this program uses only part of
// them.
#[allow(dead_code)]
#[path = "../tests/it/support/mock.rs"]
mod mock;
#[allow(dead_code)]
#[path = "../tests/it/support/stand_in.rs"]
mod stand_in;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn num(args: &[String], name: &str, default: u64) -> u64 {
    arg(args, name).map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name}: not a number")))
}

/// A stand-in server in its own process (this example, `stand-in`), and its URL.
struct Proc(Child, String);

impl Proc {
    fn stand_in(delay_ms: u64) -> Proc {
        let exe = std::env::current_exe().unwrap();
        Self::start(Command::new(exe).args(["stand-in", "--delay-ms", &delay_ms.to_string()]))
    }

    fn serve(moge: &str, weights: &str) -> Proc {
        Self::start(Command::new(moge).args(["serve", "--port", "0", "--weights", weights, "--warmup"]))
    }

    /// Waits (at most 120 s) for the process's `listening on URL` line.
    fn start(cmd: &mut Command) -> Proc {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx.recv_timeout(Duration::from_secs(120)).expect("no ready line");
        let url = line.rsplit(' ').next().unwrap().to_owned();
        Proc(child, url)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CPU seconds (user + system) of the children waited for so far.
fn children_cpu() -> f64 {
    // SAFETY: getrusage writes one rusage into the zeroed struct it is given.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN is a valid `who`.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut r) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    s(r.ru_utime) + s(r.ru_stime)
}

/// `moge batch` of `photos` into a fresh `out`: wall and CPU seconds of the client.
fn batch(moge: &str, photos: &Path, out: &Path, urls: &[String], extra: &[&str]) -> (f64, f64) {
    let _ = std::fs::remove_dir_all(out);
    let cpu = children_cpu();
    let t = Instant::now();
    let status = Command::new(moge)
        .args(["batch", photos.to_str().unwrap(), "-o", out.to_str().unwrap(), "--quiet", "--server", &urls.join(",")])
        .args(extra)
        .status()
        .unwrap();
    let wall = t.elapsed().as_secs_f64();
    assert!(status.success(), "moge batch failed");
    (wall, children_cpu() - cpu)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `n` photos of `w`x`h` as JPEG: smooth gradients with grain, so that they compress as photos do.
fn photos(dir: &Path, n: usize, w: u32, h: u32) -> PathBuf {
    let root = dir.join("photos");
    std::fs::create_dir_all(&root).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..n {
        let img = image::RgbImage::from_fn(w, h, |x, y| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let grain = (seed & 15) as u32;
            image::Rgb([((x * 255 / w + grain) % 256) as u8, ((y * 255 / h + grain + i as u32 * 9) % 256) as u8, ((x + y) / 16 % 256) as u8])
        });
        img.save(root.join(format!("p{i:03}.jpg"))).unwrap();
    }
    root
}

fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |k: &str| info.lines().find(|l| l.starts_with(k)).and_then(|l| l.split(':').nth(1)).map(str::trim).unwrap_or("?").to_owned();
    format!("{} (cpu family {}), {} cores", field("model name"), field("cpu family"), std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn fanout(args: &[String]) {
    let moge = arg(args, "--moge").expect("--moge BIN");
    let (n, delay, rounds) = (num(args, "--photos", 48) as usize, num(args, "--delay-ms", 200), num(args, "--rounds", 3));
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path(), n, 64, 48);
    let sizes = [1usize, 2, 4, 8];
    let servers: Vec<Proc> = (0..8).map(|_| Proc::stand_in(delay)).collect();
    println!("cpu: {}", cpu_name());
    println!("{n} photos of 64x48, stand-in servers answering after {delay} ms, --in-flight 1, {rounds} rounds (pool sizes alternated)");
    let mut walls = vec![Vec::new(); sizes.len()];
    let mut cpus = vec![Vec::new(); sizes.len()];
    for _ in 0..rounds {
        for (k, &size) in sizes.iter().enumerate() {
            let urls: Vec<String> = servers[..size].iter().map(|p| p.1.clone()).collect();
            let (wall, cpu) = batch(&moge, &photos, &dir.path().join("out"), &urls, &["--in-flight", "1", "--format", "npz"]);
            walls[k].push(wall);
            cpus[k].push(cpu);
        }
    }
    let one = median(walls[0].clone());
    println!("servers  wall s (median)  ideal s  speedup  efficiency  client CPU s");
    for (k, &size) in sizes.iter().enumerate() {
        let wall = median(walls[k].clone());
        let ideal = (n as f64 / size as f64).ceil() * delay as f64 / 1e3;
        let speedup = one / wall;
        println!("{size:>7}  {wall:>14.2}  {ideal:>7.2}  {speedup:>6.2}x  {:>9.1} %  {:>12.2}", 100.0 * speedup / size as f64, median(cpus[k].clone()));
    }
}

fn client(args: &[String]) {
    let moge = arg(args, "--moge").expect("--moge BIN");
    let weights = arg(args, "--weights").expect("--weights CHECKPOINT (for moge serve)");
    let n = num(args, "--photos", 12) as usize;
    let format = arg(args, "--format").unwrap_or_else(|| "npz".into());
    let rounds = num(args, "--rounds", 3);
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path(), n, 1920, 1080);
    let stand_in = Proc::stand_in(0);
    let serve = Proc::serve(&moge, &weights);
    println!("cpu: {}", cpu_name());
    println!("{n} photos of 1920x1080 (JPEG), --format {format}, --in-flight 4, {rounds} rounds alternated");
    let mut rows: Vec<(&str, Vec<f64>, Vec<f64>)> = vec![("stand-in (answers at once)", vec![], vec![]), ("moge serve on loopback", vec![], vec![])];
    for _ in 0..rounds {
        for (row, url) in rows.iter_mut().zip([&stand_in.1, &serve.1]) {
            let (wall, cpu) = batch(&moge, &photos, &dir.path().join("out"), std::slice::from_ref(url), &["--format", &format]);
            row.1.push(wall);
            row.2.push(cpu);
        }
    }
    println!("server                      client CPU ms/photo  wall ms/photo  photos/s per client core");
    for (name, walls, cpus) in rows {
        let cpu_ms = median(cpus) * 1e3 / n as f64;
        println!("{name:<28}{cpu_ms:>19.1}  {:>13.1}  {:>24.1}", median(walls) * 1e3 / n as f64, 1e3 / cpu_ms);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("fanout") => fanout(&args),
        Some("client") => client(&args),
        Some("stand-in") => {
            let s = stand_in::StandIn::start(Duration::from_millis(num(&args, "--delay-ms", 0)));
            println!("moge: listening on {}", s.url());
            // Until killed.
            loop {
                std::thread::park();
            }
        }
        _ => eprintln!("usage: pool_bench fanout|client --moge BIN ... (see the source's first lines)"),
    }
}
