//! The coordinator thread: initialises NVML (again, with backoff, after the driver went away),
//! runs one [`Session`] per initialisation, ticks it on a fixed schedule and publishes every
//! tick's snapshot.
//!
//! Ticks start one interval after the last one started, or at once after one that overran. A
//! session ends when every device that answered says the driver is gone (UNINITIALIZED /
//! DRIVER_NOT_LOADED: initialise again with backoff) or when a device index no longer exists
//! (the device set changed: initialise again once the interval is over). The next session
//! discovers the devices anew, so neither threads nor series of vanished GPUs accumulate.
//!
//! While NVML is down, every attempt publishes a snapshot that says why (`nvml_up` false).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use nvml_wrapper::Nvml;

use super::session::Session;
use super::{LiveOptions, down_snapshot};
use crate::health::Tracker;
use crate::nvml::discovery;
use crate::nvml::error::{ErrorCounter, LogLimiter, NvmlUnavailable};
use crate::nvml::events::XidLog;
use crate::sample::Snapshot;

/// First wait after a failed NVML initialisation; doubled after each failure.
const INIT_BACKOFF_START: Duration = Duration::from_secs(1);
/// Longest wait between two initialisation attempts.
const INIT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Served for the tick on which the driver went away, before the re-initialisation.
const DRIVER_GONE: &str = "NVML stopped answering (driver unloaded?); re-initialising";

/// Exponential backoff for NVML initialisation.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Self {
        Backoff {
            next: INIT_BACKOFF_START,
        }
    }

    /// The wait before the next attempt; doubles up to the maximum.
    fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(INIT_BACKOFF_MAX);
        d
    }
}

/// How an NVML session ended.
enum SessionEnd {
    Shutdown,
    /// NVML stopped answering (driver unloaded, restarted…) or could not list devices: go back
    /// to initialisation, with the reason.
    Reinit(NvmlUnavailable),
    /// NVML answers but a device index no longer exists: initialise and discover again at once.
    Rediscover,
}

/// The sampler's own thread.
pub(super) struct Coordinator<P> {
    /// Read again at every tick: a configuration reload may change them.
    opts: LiveOptions,
    publish: P,
    /// Disconnects when the sampler is stopped; nothing is ever sent on it.
    stop: Receiver<()>,
    /// Cumulative over the whole life of the sampler, across re-initialisations.
    errors: Arc<ErrorCounter>,
    xids: Arc<XidLog>,
    /// What the health verdicts remember, across re-initialisations (a driver reload resets
    /// what it held) and, with a state file, across restarts.
    health: Tracker,
    /// Rate-limits the coordinator's repeating warnings (init failures, rediscoveries).
    log: LogLimiter,
}

impl<P: Fn(Snapshot)> Coordinator<P> {
    /// A coordinator that publishes with `publish` until `stop` disconnects.
    pub(super) fn new(opts: LiveOptions, publish: P, stop: Receiver<()>) -> Self {
        let health = Tracker::new(opts.get().health_state_file.clone());
        Coordinator {
            opts,
            publish,
            stop,
            errors: Arc::new(ErrorCounter::default()),
            xids: Arc::new(XidLog::default()),
            health,
            log: LogLimiter::default(),
        }
    }

    /// Initialises NVML and runs sessions until stopped.
    pub(super) fn run(mut self) {
        let mut backoff = Backoff::new();
        loop {
            let lib = self.opts.get().nvml_lib.clone();
            let reason = match discovery::init(&lib) {
                Ok(nvml) => {
                    backoff = Backoff::new();
                    tracing::info!(lib = %lib.display(), "NVML initialised");
                    match self.run_session(Arc::new(nvml)) {
                        SessionEnd::Shutdown => return,
                        SessionEnd::Reinit(reason) => {
                            if matches!(reason, NvmlUnavailable::DriverGone) {
                                // Reloading the driver resets the GPUs.
                                self.health.driver_reloaded();
                            }
                            reason
                        }
                        // The session already waited out its tick, so this cannot spin.
                        SessionEnd::Rediscover => continue,
                    }
                }
                Err(reason) => reason,
            };
            let delay = backoff.next_delay();
            let text = reason.to_string();
            if self.log.allow(&text, Instant::now()) {
                tracing::warn!(retry_in = ?delay, "NVML not available: {text}");
            }
            (self.publish)(down_snapshot(&reason, &self.errors));
            match self.stop.recv_timeout(delay) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// One NVML session: discovery, then ticks until shutdown or until NVML stops answering.
    fn run_session(&mut self, nvml: Arc<Nvml>) -> SessionEnd {
        let opts = self.opts.get();
        let mut session = match Session::start(nvml, &opts, &self.errors, Some(&self.xids)) {
            Ok(s) => s,
            Err(reason) => return SessionEnd::Reinit(reason),
        };
        tracing::info!(
            gpus = session.device_count(),
            driver = %session.system().driver_version,
            "devices discovered"
        );
        let end = self.run_ticks(&mut session);
        session.stop();
        end
    }

    /// Ticks `session` on schedule, publishing each tick, until it ends.
    fn run_ticks(&mut self, session: &mut Session) -> SessionEnd {
        let mut xids_pruned = false;
        let mut start = Instant::now();
        loop {
            let opts = self.opts.get();
            session.configure(&opts);
            self.health
                .set_fabric_registration_timeout(opts.fabric_registration_timeout);
            let deadline = start + opts.device_timeout;
            if session.tick(start, deadline, &self.stop).is_err() {
                return SessionEnd::Shutdown;
            }
            let grace = opts.stale_grace;
            let mut snapshot = session.snapshot(
                start,
                grace,
                &self.errors,
                Some(&self.xids),
                &mut self.health,
            );
            // Once every device is identified, drop XID counts of devices that went away.
            if !xids_pruned && snapshot.devices.iter().all(|d| !d.uuid.is_empty()) {
                let uuids: HashSet<String> =
                    snapshot.devices.iter().map(|d| d.uuid.clone()).collect();
                self.xids.retain(&uuids);
                xids_pruned = true;
            }
            if session.driver_gone() {
                // Served like every other moment NVML is down: no GPU series at all. The devices
                // of this tick only hold what NVML refused, and the re-initialisation decides
                // which GPUs there are.
                snapshot.nvml_up = false;
                snapshot.nvml_error = Some(DRIVER_GONE.into());
                snapshot.devices.clear();
                (self.publish)(snapshot);
                return SessionEnd::Reinit(NvmlUnavailable::DriverGone);
            }
            (self.publish)(snapshot);
            // The next tick starts an interval after this one did, or now if this one overran.
            let next = (start + opts.interval).max(Instant::now());
            let changed = session.device_set_changed();
            if changed {
                let message = "a device index no longer exists; rediscovering the devices";
                if self.log.allow(message, Instant::now()) {
                    tracing::warn!("{message}");
                }
            }
            if session.wait_until(next, &self.stop).is_err() {
                return SessionEnd::Shutdown;
            }
            if changed {
                // Once the interval is over, so that rediscovering cannot spin.
                return SessionEnd::Rediscover;
            }
            start = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_thirty_seconds() {
        let mut b = Backoff::new();
        let delays: Vec<u64> = (0..8).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
