//! How many requests one client has open at once.

use std::sync::{Condvar, Mutex};

/// A counting semaphore: [`ClientOptions::in_flight`](super::ClientOptions::in_flight).
pub(super) struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

pub(super) struct Turn<'a>(&'a Slots);

impl Slots {
    pub(super) fn new(n: usize) -> Self {
        Slots { free: Mutex::new(n), freed: Condvar::new() }
    }

    pub(super) fn take(&self) -> Turn<'_> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
        Turn(self)
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}
