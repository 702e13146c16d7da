//! The middle stage's threads: a bounded queue and the lanes that empty it, one after another
//! per lane. The device worker is one lane that owns the forwards (`moge batch` and `moge
//! predict` queue decoded photos, `moge serve` queues HTTP requests); a server as the middle
//! stage takes as many lanes as requests in flight. What a lane does with an item, and where
//! the result goes, is the caller's.

use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{bounded, Sender, TrySendError};

use super::guard::guarded;
use crate::model::{Prepared, RawOutput, Runner};

/// Why [`Worker::try_submit`] gave the item back.
pub enum Refused<T> {
    /// The queue is full.
    Busy(T),
    /// The worker has stopped.
    Gone(T),
}

pub struct Worker<T> {
    tx: Mutex<Option<Sender<T>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl<T: Send + 'static> Worker<T> {
    /// Starts `lanes` threads named `name` with room for `capacity` waiting items; each item
    /// reaches `work` once, on one of the lanes, in queue order per lane.
    pub fn spawn(name: &str, lanes: usize, capacity: usize, work: impl Fn(T) + Send + Sync + 'static) -> Self {
        super::guard::install_panic_hook();
        let (tx, rx) = bounded::<T>(capacity.max(1));
        let work = std::sync::Arc::new(work);
        let threads = (0..lanes.max(1))
            .map(|_| {
                let (rx, work) = (rx.clone(), work.clone());
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || {
                        for item in rx {
                            work(item);
                        }
                    })
                    .expect("cannot start a worker thread")
            })
            .collect();
        Self { tx: Mutex::new(Some(tx)), threads: Mutex::new(threads) }
    }
}

impl<T> Worker<T> {
    /// Queues `item`, waiting while the queue is full; gives it back if the worker has stopped.
    pub fn submit(&self, item: T) -> Result<(), T> {
        match self.sender() {
            Some(tx) => tx.send(item).map_err(|e| e.into_inner()),
            None => Err(item),
        }
    }

    fn sender(&self) -> Option<Sender<T>> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Queues `item` if there is room now.
    pub fn try_submit(&self, item: T) -> Result<(), Refused<T>> {
        match self.sender() {
            Some(tx) => tx.try_send(item).map_err(|e| match e {
                TrySendError::Full(t) => Refused::Busy(t),
                TrySendError::Disconnected(t) => Refused::Gone(t),
            }),
            None => Err(Refused::Gone(item)),
        }
    }

    /// Closes the queue and waits until every item already queued has been worked.
    pub fn close(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl<T> Drop for Worker<T> {
    fn drop(&mut self) {
        self.close();
    }
}

/// One forward on the device, timed; a panic in it fails this forward only.
pub fn forward(runner: &Runner, prep: &Prepared) -> anyhow::Result<(RawOutput, f64)> {
    let t = Instant::now();
    let raw = guarded(|| runner.forward(prep)).map_err(|e| e.context("forward failed"))?;
    Ok((raw, t.elapsed().as_secs_f64() * 1e3))
}
