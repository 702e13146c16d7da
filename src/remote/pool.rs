//! A pool of MoGe-2 servers (`--server A --server B ...`): one server per device (a GPU, a
//! Tenstorrent chip), each photo sent to one of them.
//!
//! Each server takes up to its own number of requests at once; a photo goes to the least loaded
//! server that is up. A server that fails (no connection, no answer in time, at once; a 5xx or
//! 429 once the client's retries are spent) is taken out and the photo is sent to another; a
//! thread probes the servers that are out (`GET /health`, once a second, less often for one that
//! keeps failing soon after it came back) and takes each back when it answers. A run stops with
//! a fatal error only when no server has answered for [`ALL_DOWN_GRACE`].
//!
//! Every server must run the same model (name, weights digest, normal head, normals' type), so
//! that a photo's outputs do not depend on which one answered; its sidecar names that one.
//! `pipeline::pool` is the pool as a run's middle stage.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::{Client, ClientOptions, RemoteError, Response};
use crate::console::{Notice, NoticeSink};
use crate::protocol::PredictOptions;

/// How often the servers that are out are probed.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// The longest wait between two probes of a server that keeps failing.
const MAX_PROBE_WAIT: Duration = Duration::from_secs(60);
/// A server taken out again within this time of coming back counts one more strike.
const FLAP_WINDOW: Duration = Duration::from_secs(30);
/// How long the pool waits for a server to come back once every one is out, before the run
/// stops: a moment's outage of the network (or a rolling restart) is not the end of a batch.
pub const ALL_DOWN_GRACE: Duration = Duration::from_secs(5);
/// A photo on which this many servers failed with a 500 fails itself: it is the photo, not the
/// servers (each is taken out for one probe at most).
const PHOTO_500_LIMIT: usize = 2;

/// Why the pool cannot go on. Why each server was taken out was said when it was.
#[derive(Debug, thiserror::Error)]
#[error("no server of the pool answers ({urls})")]
pub struct NoServerLeft {
    pub urls: String,
}

/// What the pool knows of a server's model: servers that differ here give different outputs.
#[derive(Debug, Clone, PartialEq)]
struct Identity {
    model: Option<String>,
    weights: Option<String>,
    has_normal: bool,
    normal_dtype: Option<crate::protocol::NormalDtype>,
}

impl Identity {
    fn of(c: &Client) -> Self {
        Identity {
            model: c.model().map(str::to_owned),
            weights: c.info().get("weights_sha256").and_then(|v| v.as_str()).map(str::to_owned),
            has_normal: c.has_normal(),
            normal_dtype: c.normal_dtype(),
        }
    }

    /// Why `other` cannot serve beside `self`: the same weights (by digest where both give one,
    /// else by the model's name; moge serve digests its weights in the background, and names a
    /// checkpoint file by its file name) with the same normals.
    fn differs(&self, other: &Identity) -> Option<String> {
        let same_weights = match (&self.weights, &other.weights) {
            (Some(a), Some(b)) => a == b,
            _ => self.model == other.model,
        };
        let same = same_weights && self.has_normal == other.has_normal && self.normal_dtype == other.normal_dtype;
        (!same).then(|| format!("{} (weights {})", other.describe(), other.weights.as_deref().unwrap_or("not given")))
    }

    fn describe(&self) -> String {
        let normal = match (self.has_normal, self.normal_dtype) {
            (false, _) => "no normals",
            (true, Some(_)) => "float32 normals",
            (true, None) => "float16 normals",
        };
        format!("{}, {normal}", self.model.as_deref().unwrap_or("an unnamed model"))
    }
}

enum Health {
    Up,
    /// Taken out (why was said on stderr); probed until it answers.
    Down,
    /// Runs another model: never used.
    Excluded,
}

struct Member {
    url: String,
    /// The connection of the server's last `/info` (at the start, or when it last came back);
    /// `None` until it has answered once.
    client: RwLock<Option<Arc<Client>>>,
    limit: usize,
}

struct State {
    busy: Vec<usize>,
    health: Vec<Health>,
    /// When each server that is out is probed next.
    next_probe: Vec<Instant>,
    /// Times taken out in a row, each soon after it came back: a server whose `/health`
    /// answers while its predictions fail is probed less and less often.
    strikes: Vec<u32>,
    back_at: Vec<Option<Instant>>,
}

impl State {
    /// The wait before server `i`'s next probe: [`PROBE_EVERY`], doubled with each strike.
    fn probe_wait(&self, i: usize) -> Duration {
        PROBE_EVERY.saturating_mul(1 << self.strikes[i].saturating_sub(1).min(6)).min(MAX_PROBE_WAIT)
    }
}

struct Inner {
    members: Vec<Member>,
    state: Mutex<State>,
    changed: Condvar,
    /// The model of the first server that answered: every other must match it.
    reference: Identity,
    opts: ClientOptions,
    closing: AtomicBool,
    /// Where the pool says a server went out or came back.
    notify: NoticeSink,
}

/// The servers, and which of them are up and how busy.
pub struct Pool {
    inner: Arc<Inner>,
    prober: Option<JoinHandle<()>>,
}

/// A photo's answer, and which server gave it.
pub struct Answer {
    /// The index of the server that answered, for [`Pool::client`].
    pub member: usize,
    pub response: Response,
    /// The servers that failed on this photo before, in order.
    pub resent_from: Vec<String>,
}

impl Pool {
    /// Connects to every server in `urls` (at once, each in its own thread), `opts.in_flight`
    /// requests at most to each. Servers that cannot be reached now are probed until they
    /// answer; the pool fails only when none answers, or when two run different models. Says
    /// nothing of the servers that go out and come back: see [`Pool::connect_noting`].
    pub fn connect(urls: &[String], opts: ClientOptions) -> Result<Self> {
        Self::connect_noting(urls, opts, std::sync::Arc::new(|_| {}))
    }

    /// [`Pool::connect`], telling `notify` of each server that cannot be reached, is taken
    /// out, comes back or is left out (from the prober's thread too, for the pool's life).
    pub fn connect_noting(urls: &[String], opts: ClientOptions, notify: NoticeSink) -> Result<Self> {
        anyhow::ensure!(!urls.is_empty(), "a pool needs at least one server");
        let opts = ClientOptions { retry_no_answer: false, ..opts };
        let connected: Vec<Result<Client>> = std::thread::scope(|s| {
            let handles: Vec<_> = urls.iter().map(|u| s.spawn(|| Client::connect(u, opts.clone()))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the connection thread panicked")))).collect()
        });
        let mut reference: Option<(String, Identity)> = None;
        let mut members = Vec::with_capacity(urls.len());
        let mut health = Vec::with_capacity(urls.len());
        let mut first_error = None;
        for (url, c) in urls.iter().zip(connected) {
            let member = Member { url: url.clone(), client: RwLock::new(None), limit: opts.in_flight.max(1) };
            match c {
                Ok(client) => {
                    let id = Identity::of(&client);
                    match &reference {
                        None => reference = Some((client.url().to_owned(), id)),
                        Some((first, want)) => {
                            if let Some(got) = want.differs(&id) {
                                anyhow::bail!("the servers of the pool run different models: {first} runs {}, {} runs {got}", want.describe(), client.url());
                            }
                        }
                    }
                    *member.client.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(client));
                    health.push(Health::Up);
                }
                // A server that is not there now, not ready yet (503 while it loads) or not
                // answering may come up later; any other failure (not a MoGe server, a bad URL)
                // is the user's to fix.
                Err(e) if e.downcast_ref::<RemoteError>().is_some_and(is_servers) => {
                    let reason = crate::console::error_line(&e);
                    notify(Notice::Warning(format!("{reason}; probing it every {} s", PROBE_EVERY.as_secs())));
                    health.push(Health::Down);
                    first_error.get_or_insert(e);
                }
                Err(e) => return Err(e.context(format!("{url}: cannot join the pool"))),
            }
            members.push(member);
        }
        let Some((_, reference)) = reference else {
            return Err(first_error.expect("a server failed").context("no server of the pool answers"));
        };
        let n = members.len();
        let state = State { busy: vec![0; n], health, next_probe: vec![Instant::now() + PROBE_EVERY; n], strikes: vec![1; n], back_at: vec![None; n] };
        let inner = Arc::new(Inner { members, state: Mutex::new(state), changed: Condvar::new(), reference, opts, closing: AtomicBool::new(false), notify });
        let prober = {
            let inner = inner.clone();
            std::thread::Builder::new().name("moge-probe".into()).spawn(move || inner.probe_loop())?
        };
        Ok(Self { inner, prober: Some(prober) })
    }

    /// A server that has answered.
    pub fn first(&self) -> Arc<Client> {
        self.inner.members.iter().find_map(|m| m.client()).expect("a pool has a server that answered")
    }

    /// The connection to server `member`, which has answered.
    pub fn client(&self, member: usize) -> Arc<Client> {
        self.inner.members[member].client().expect("a server that is up has answered")
    }

    /// Requests the pool takes at once: every server's limit.
    pub fn capacity(&self) -> usize {
        self.inner.members.iter().map(|m| m.limit).sum()
    }

    /// Whether the pool's model has the normal head.
    pub fn has_normal(&self) -> bool {
        self.inner.reference.has_normal
    }

    /// Sends a photo to the least loaded server that is up, and to another while servers fail
    /// on it; [`NoServerLeft`] when none is up for [`ALL_DOWN_GRACE`].
    pub fn predict(&self, image: &[u8], options: &PredictOptions) -> Result<Answer> {
        let inner = &self.inner;
        let mut resent_from = Vec::new();
        let mut failed_500 = 0;
        loop {
            let i = inner.take()?;
            let answer = self.client(i).predict(image, options);
            inner.release(i);
            match answer {
                Ok(response) => return Ok(Answer { member: i, response, resent_from }),
                Err(e) if is_servers(&e) => {
                    failed_500 += usize::from(matches!(e, RemoteError::Server { status: 500, .. }));
                    if failed_500 >= PHOTO_500_LIMIT {
                        return Err(anyhow::Error::new(e).context(format!("{PHOTO_500_LIMIT} servers failed on this photo")));
                    }
                    inner.take_out(i, &e);
                    resent_from.push(inner.members[i].url.clone());
                    // A photo every server fails on (too large for the time limit, or one that
                    // brings a server down) fails itself rather than going round for ever.
                    if resent_from.len() >= inner.members.len().max(PHOTO_500_LIMIT) {
                        return Err(anyhow::Error::new(e).context(format!("{} attempts on the pool's servers failed on this photo", resent_from.len())));
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Under the lock, so that the prober, between its look at the flag and its wait, does
        // not miss the wake-up.
        {
            let _st = self.inner.lock();
            self.inner.closing.store(true, Ordering::Relaxed);
        }
        self.inner.changed.notify_all();
        if let Some(t) = self.prober.take() {
            let _ = t.join();
        }
    }
}

impl Member {
    fn client(&self) -> Option<Arc<Client>> {
        self.client.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place on the least loaded server that is up, waiting while every one is full; an error
    /// once none has been up for [`ALL_DOWN_GRACE`].
    fn take(&self) -> Result<usize, NoServerLeft> {
        let mut st = self.lock();
        let mut none_since: Option<Instant> = None;
        loop {
            let free = (0..self.members.len())
                .filter(|&i| matches!(st.health[i], Health::Up) && st.busy[i] < self.members[i].limit)
                .min_by_key(|&i| (st.busy[i] * 1024 / self.members[i].limit, st.busy[i]));
            if let Some(i) = free {
                st.busy[i] += 1;
                return Ok(i);
            }
            let any_up = st.health.iter().any(|h| matches!(h, Health::Up));
            let wait = if any_up {
                none_since = None;
                PROBE_EVERY
            } else {
                let since = *none_since.get_or_insert_with(Instant::now);
                match ALL_DOWN_GRACE.checked_sub(since.elapsed()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return Err(NoServerLeft { urls: self.members.iter().map(|m| m.url.as_str()).collect::<Vec<_>>().join(", ") }),
                }
            };
            st = self.changed.wait_timeout(st, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn release(&self, i: usize) {
        self.lock().busy[i] -= 1;
        self.changed.notify_all();
    }

    /// Takes server `i` out after `why`; said once, when it goes.
    fn take_out(&self, i: usize, why: &RemoteError) {
        let mut st = self.lock();
        if matches!(st.health[i], Health::Up) {
            let left = st.health.iter().filter(|h| matches!(h, Health::Up)).count() - 1;
            (self.notify)(Notice::Warning(format!(
                "{why}: taken out of the pool ({left} of {} servers left); its photos go to the others",
                self.members.len()
            )));
            st.health[i] = Health::Down;
            let flapping = st.back_at[i].is_some_and(|t| t.elapsed() < FLAP_WINDOW);
            st.strikes[i] = if flapping { st.strikes[i] + 1 } else { 1 };
            st.next_probe[i] = Instant::now() + st.probe_wait(i);
        }
        drop(st);
        self.changed.notify_all();
    }

    /// Until the pool closes: each server that is out is asked `/health` when its probe is due
    /// (one that never answered is connected to), and taken back when it answers.
    fn probe_loop(&self) {
        loop {
            let due: Vec<usize> = {
                let st = self.lock();
                if self.closing.load(Ordering::Relaxed) {
                    return;
                }
                let now = Instant::now();
                let down = || (0..self.members.len()).filter(|&i| matches!(st.health[i], Health::Down));
                let due: Vec<usize> = down().filter(|&i| st.next_probe[i] <= now).collect();
                if due.is_empty() {
                    let next = down().map(|i| st.next_probe[i].saturating_duration_since(now)).min().unwrap_or(PROBE_EVERY);
                    drop(self.changed.wait_timeout(st, next.max(Duration::from_millis(10))));
                }
                due
            };
            if self.closing.load(Ordering::Relaxed) {
                return;
            }
            for i in due {
                let back = self.probe(i);
                let mut st = self.lock();
                match back {
                    Ok(()) => {
                        (self.notify)(Notice::Info(format!("the server at {} answers again: back in the pool", self.members[i].url)));
                        st.health[i] = Health::Up;
                        st.back_at[i] = Some(Instant::now());
                    }
                    Err(Some(excluded)) => {
                        (self.notify)(Notice::Warning(format!("{excluded}: left out of the pool")));
                        st.health[i] = Health::Excluded;
                    }
                    Err(None) => st.next_probe[i] = Instant::now() + st.probe_wait(i),
                }
                drop(st);
                self.changed.notify_all();
                if self.closing.load(Ordering::Relaxed) {
                    return;
                }
            }
        }
    }

    /// Whether server `i` is back; `Err(Some(why))` when it is there but runs another model.
    /// `/health` and `/info` are asked anew (within 5 s each), so that a server restarted with
    /// other weights is not taken back.
    fn probe(&self, i: usize) -> Result<(), Option<String>> {
        let m = &self.members[i];
        let client = Client::probe(&m.url, self.opts.clone()).map_err(|_| None)?;
        if let Some(got) = self.reference.differs(&Identity::of(&client)) {
            return Err(Some(format!("the server at {} runs {got}, not {}", client.url(), self.reference.describe())));
        }
        *m.client.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(client));
        Ok(())
    }
}

/// Whether a failure is the server's (it is taken out and the photo sent elsewhere) rather
/// than the photo's.
fn is_servers(e: &RemoteError) -> bool {
    match e {
        RemoteError::Unreachable { .. } | RemoteError::Timeout { .. } | RemoteError::Server { .. } => true,
        RemoteError::Rejected { status, .. } => matches!(status, 408 | 429),
        RemoteError::Protocol { .. } => false,
    }
}
