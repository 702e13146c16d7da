//! The device worker: one thread that owns the forwards and runs them one after another, fed
//! by a bounded queue. `moge batch` and `moge predict` queue decoded photos, `moge serve`
//! queues HTTP requests; what comes out goes to a sink that the caller chooses.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{bounded, Sender, TrySendError};

use super::guard::guarded;
use crate::model::{Prepared, RawOutput};
use crate::Model;

/// What the worker runs the forward of.
pub trait Work: Send + 'static {
    fn prepared(&self) -> &Prepared;
}

/// The outcome of one queued item.
pub enum Forward {
    Done {
        raw: RawOutput,
        ms: f64,
    },
    Failed(anyhow::Error),
    /// Not run: the worker was cancelled while the item waited.
    Cancelled,
}

/// Why [`DeviceWorker::try_submit`] gave the item back.
pub enum Refused<T> {
    /// The queue is full.
    Busy(T),
    /// The worker has stopped.
    Gone(T),
}

pub struct DeviceWorker<T: Work> {
    tx: Mutex<Option<Sender<T>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<T: Work> DeviceWorker<T> {
    /// Starts the worker with room for `capacity` waiting items. Every item reaches `sink`
    /// once, on the worker thread, in queue order; once `cancelled()` is true the items still
    /// waiting reach it as [`Forward::Cancelled`]. A panic in a forward fails that item only.
    pub fn spawn(model: Arc<Model>, capacity: usize, cancelled: impl Fn() -> bool + Send + 'static, mut sink: impl FnMut(T, Forward) + Send + 'static) -> Self {
        super::guard::install_panic_hook();
        let (tx, rx) = bounded::<T>(capacity.max(1));
        let thread = std::thread::Builder::new()
            .name("moge-device".into())
            .spawn(move || {
                for item in rx {
                    if cancelled() {
                        sink(item, Forward::Cancelled);
                        continue;
                    }
                    let t = Instant::now();
                    let out = match guarded(|| model.forward(item.prepared())) {
                        Ok(raw) => Forward::Done { raw, ms: t.elapsed().as_secs_f64() * 1e3 },
                        Err(e) => Forward::Failed(e.context("forward failed")),
                    };
                    sink(item, out);
                }
            })
            .expect("cannot start the device worker thread");
        Self { tx: Mutex::new(Some(tx)), thread: Mutex::new(Some(thread)) }
    }

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

    /// Closes the queue and waits until every item already queued has reached the sink.
    pub fn close(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl<T: Work> Drop for DeviceWorker<T> {
    fn drop(&mut self) {
        self.close();
    }
}
