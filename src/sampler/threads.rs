//! [`ThreadGroup`]: the sampler's threads, joined within a time bound when they stop. A thread
//! stuck inside a hung NVML call cannot be interrupted, so the group leaves it detached after the
//! bound instead of blocking shutdown; it ends by itself if the call ever returns.

use std::io;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Threads whose end can be awaited with a time bound. Each thread holds a clone of a sender
/// that is dropped when it ends (also by panic); the receiver sees "disconnected" once all are.
pub(super) struct ThreadGroup {
    done_tx: Sender<()>,
    done_rx: Receiver<()>,
    handles: Vec<JoinHandle<()>>,
}

impl ThreadGroup {
    /// An empty group.
    pub(super) fn new() -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        ThreadGroup {
            done_tx,
            done_rx,
            handles: Vec::new(),
        }
    }

    /// Starts `f` on a new thread called `name`, in this group.
    pub(super) fn spawn(
        &mut self,
        name: String,
        f: impl FnOnce() + Send + 'static,
    ) -> io::Result<()> {
        let token = self.done_tx.clone();
        let handle = thread::Builder::new().name(name).spawn(move || {
            let _token = token;
            f();
        })?;
        self.handles.push(handle);
        Ok(())
    }

    /// Joins every thread if all end within `bound`; otherwise leaves them detached. True when
    /// all ended.
    pub(super) fn join_within(self, bound: Duration) -> bool {
        let ThreadGroup {
            done_tx,
            done_rx,
            handles,
        } = self;
        drop(done_tx);
        let deadline = Instant::now() + bound;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match done_rx.recv_timeout(left) {
                Ok(()) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => return false,
            }
        }
        for h in handles {
            // Every thread has dropped its token, so each join returns at once.
            let _ = h.join();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_group_joins_finished_threads_and_detaches_stuck_ones() {
        let mut g = ThreadGroup::new();
        g.spawn("quick".into(), || {}).unwrap();
        assert!(g.join_within(Duration::from_secs(5)));

        let (release_tx, release_rx) = mpsc::channel::<()>();
        let mut g = ThreadGroup::new();
        g.spawn("stuck".into(), move || {
            let _ = release_rx.recv();
        })
        .unwrap();
        assert!(!g.join_within(Duration::from_millis(50)));
        drop(release_tx); // let the detached thread end
    }
}
