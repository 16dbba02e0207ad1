//! Reloading the configuration without a restart: on SIGHUP, and when the `--config` or
//! `--web-config` file changes on disk.
//!
//! Every [`FILE_CHECK`] the device, inode, size, modification and change times of both files
//! (and of the OTLP push's headers and TLS files) are
//! compared with the last seen (as the TLS reloader does for certificates), through the path
//! each time: a Kubernetes ConfigMap or Secret volume swaps a symlink to a new directory, so the
//! file the path names is a new inode. A reload runs the same loading as the start, with the
//! original command line and environment, so the precedence defaults < file < environment <
//! flags holds (a flag still beats the file), and reads the web-config file the result names.
//! Reloads are at least [`MIN_RELOAD_GAP`] apart: SIGHUPs and file changes that come while one
//! runs or within the gap after it give one reload when the gap is over, not one each.
//!
//! What can change applies as a whole, or nothing does: everything is read and checked first
//! (options, bcrypt hashes, certificate and key), then applied. Applied at run time: the encoder's
//! options ([`Config::metrics_options`]: the last tick is encoded again at once), the sampler's
//! options ([`Config::sampler_options`], from the next tick), the Kubernetes options (their tasks
//! are started anew by the `StartKubernetes` that `lib.rs` gives; the kubelet state and its
//! counters carry on), the OTLP push (its options, with the headers and TLS files read again,
//! apply from its next request, keeping its queue and counters; an endpoint given or taken
//! away starts it, through the `StartOtlp` it gives, or stops it), the basic-auth users (turning
//! basic auth on, or changing the users) and the TLS settings and files. What was set up once at
//! the start needs a restart: the listening socket (`listen`), the NVML library (`nvml_lib`,
//! `demo`), the sampling schedule (`interval`, `device_timeout`, `stale_grace`, which the readiness
//! rule and several defaults follow), logging (`log_format`, `log_level`) and turning TLS on. A
//! change of those is logged as needing a restart, and they keep their running values.
//!
//! Security is never turned off by a reload: a web-config without the `basic_auth_users` or
//! `tls_server_config` in force (an empty file, only comments, or a `--config` that no longer
//! names a web-config) is a failed reload that keeps both in force; turning them off needs a
//! restart. Since a writer that truncates before writing (`cat > web.yml`, many editors and
//! configuration tools) leaves the file empty for a moment on every save, a file that reads empty
//! (nothing but blank lines and comments) is read again after [`EMPTY_FILE_SETTLE`] before the
//! reload judges it.
//!
//! A file that cannot be used keeps the previous configuration in force, logs one line naming
//! the file, the line and the problem, and serves `nvml_exporter_config_last_reload_successful 0`
//! until a reload succeeds (which sets it to 1 and
//! `nvml_exporter_config_last_reload_success_timestamp_seconds`, as Prometheus does). A file
//! caught half-written fails once and is read again when its writer finishes (its metadata
//! changes again).

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus::Gauge;
use tokio::signal::unix::Signal;
use tokio::sync::watch;

use crate::config::{self, Config, ConfigError};
use crate::http::auth::AuthSwitch;
use crate::http::settings::{build_auth, build_tls};
use crate::http::tls::{Stamp, TlsReloader};
use crate::http::web_config::WebConfigFile;
use crate::kubernetes::{KubernetesOptions, StateHandle, Tasks};
use crate::metrics::catalog::{
    self, CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS, CONFIG_LAST_RELOAD_SUCCESSFUL,
};
use crate::otlp::{self, OtlpOptions};
use crate::publish::Publisher;
use crate::sample::unix_now;
use crate::sampler::LiveOptions;

/// How often the files' metadata is compared with the last seen. A kubelet updates a mounted
/// ConfigMap within about a minute, so a few seconds more do not matter.
pub const FILE_CHECK: Duration = Duration::from_secs(2);

/// How long a reload waits before reading again a file that reads empty: a writer that truncates
/// before writing (`cat > web.yml`) leaves it empty for a moment, far shorter than this.
pub const EMPTY_FILE_SETTLE: Duration = Duration::from_millis(250);

/// The least time from the end of one reload to the start of the next, so that a storm of
/// SIGHUPs or file changes reloads (and restarts the kubelet refresh) about once a second at most.
pub const MIN_RELOAD_GAP: Duration = Duration::from_secs(1);

/// What starts a reload: SIGHUP, and the command line to load the configuration from again.
#[derive(Debug)]
pub struct Triggers {
    /// The process's arguments, program name included, as given at start.
    pub args: Vec<OsString>,
    /// SIGHUP deliveries; `None` when the signal cannot be watched (files are still watched).
    pub hangup: Option<Signal>,
}

/// Starts the Kubernetes tasks (the kubelet refresh, the node condition's writer) for a reload
/// that changes their options: given by `lib.rs`, which builds and starts every part.
pub(crate) type StartKubernetes = Box<dyn Fn(&KubernetesOptions, StateHandle) -> Tasks + Send>;

/// Starts the OTLP push for a reload that turns it on: given by `lib.rs`.
pub(crate) type StartOtlp = Box<dyn Fn(OtlpOptions) -> otlp::Handle + Send>;

/// The configuration in force and the parts of the running exporter that a reload changes.
pub(crate) struct Reloader {
    pub args: Vec<OsString>,
    pub config: Config,
    pub web: WebConfigFile,
    pub publisher: Arc<Publisher>,
    pub sampler: LiveOptions,
    /// With `--kubernetes`, its tasks.
    pub kubernetes: Option<Tasks>,
    pub start_kubernetes: StartKubernetes,
    /// With an OTLP endpoint, the push.
    pub otlp: Option<otlp::Handle>,
    pub start_otlp: StartOtlp,
    pub auth: Arc<AuthSwitch>,
    /// The TLS served, when it is on (turning it on or off needs a restart).
    pub tls: Option<Arc<TlsReloader>>,
    /// The files watched, with their stamps when last read.
    pub watched: Vec<(PathBuf, Option<Stamp>)>,
    /// The outcome of the last reload, served by the encoder.
    pub metrics: ReloadMetrics,
}

/// `nvml_exporter_config_last_reload_successful` and
/// `nvml_exporter_config_last_reload_success_timestamp_seconds`, as Prometheus serves them:
/// kept by the reloader, served by the encoder from the registry they are registered in.
#[derive(Debug, Clone)]
pub struct ReloadMetrics {
    successful: Gauge,
    success_time: Gauge,
}

impl ReloadMetrics {
    /// The gauges registered in `registry`, saying that the configuration loaded now (they are
    /// made right after the first load).
    pub fn new(registry: &prometheus::Registry) -> ReloadMetrics {
        let gauge = |name: &str| {
            let gauge =
                Gauge::new(name, catalog::help(name)).expect("static gauge options are valid");
            crate::metrics::registered(registry, gauge)
        };
        let metrics = ReloadMetrics {
            successful: gauge(CONFIG_LAST_RELOAD_SUCCESSFUL),
            success_time: gauge(CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS),
        };
        metrics.record(true);
        metrics
    }

    /// Records a reload: whether it succeeded, and on success when (now). Served from the next
    /// encoding on.
    pub fn record(&self, ok: bool) {
        self.successful.set(if ok { 1.0 } else { 0.0 });
        if ok {
            self.success_time.set(unix_now());
        }
    }
}

/// Why a reload runs.
#[derive(Debug, Clone, Copy)]
enum Cause {
    Hangup,
    /// Time to look at the files.
    Check,
}

impl Reloader {
    /// The files `config` reads, with their stamps now: the configuration and web-config files,
    /// and the OTLP push's headers and TLS files (a rotated Secret is read again).
    pub(crate) fn stamps(config: &Config) -> Vec<(PathBuf, Option<Stamp>)> {
        [
            config.config_file.as_ref(),
            config.web_config.as_ref(),
            config.otlp_headers_file.as_ref(),
            config.otlp_ca_file.as_ref(),
            config.otlp_client_cert_file.as_ref(),
            config.otlp_client_key_file.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|path| (path.clone(), Stamp::of_path(path)))
        .collect()
    }

    /// Reloads on SIGHUP and when a watched file changes, until `stop` turns true, at most once
    /// per [`MIN_RELOAD_GAP`]. The work (reading files, encoding) runs on a blocking thread.
    pub(crate) async fn watch(
        mut self,
        mut hangup: Option<Signal>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut next_reload = tokio::time::Instant::now();
        loop {
            // SIGHUPs that come meanwhile stay pending, all as one delivery (tokio coalesces a
            // signal's deliveries until it is asked for the next).
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep_until(next_reload) => {}
            }
            let cause = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = next(&mut hangup) => {
                    tracing::info!("SIGHUP received, reloading the configuration");
                    Cause::Hangup
                }
                // Without files there is nothing to look at, and no blocking thread is kept busy.
                () = tokio::time::sleep(FILE_CHECK), if !self.watched.is_empty() => Cause::Check,
            };
            match tokio::task::spawn_blocking(move || {
                let reloaded = self.run(cause);
                (self, reloaded)
            })
            .await
            {
                Ok((reloader, reloaded)) => {
                    self = reloader;
                    if reloaded {
                        next_reload = tokio::time::Instant::now() + MIN_RELOAD_GAP;
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "the configuration reload failed; no more reloads");
                    return;
                }
            }
        }
    }

    /// Reloads for `cause`; whether it did (a file check finds nothing changed, or something).
    fn run(&mut self, cause: Cause) -> bool {
        match cause {
            Cause::Hangup => {
                self.reload("SIGHUP");
                true
            }
            Cause::Check => {
                let changed = self
                    .watched
                    .iter()
                    .find(|(path, seen)| Stamp::of_path(path) != *seen)
                    .map(|(path, _)| path.display().to_string());
                if let Some(path) = &changed {
                    self.reload(&format!("{path} changed"));
                }
                changed.is_some()
            }
        }
    }

    /// Loads the configuration again and applies it, or keeps the one in force; records the
    /// outcome in the reload metrics.
    pub(crate) fn reload(&mut self, cause: &str) {
        // Stamped before reading, so that a write during the read is seen at the next check.
        let mut before = Reloader::stamps(&self.config);
        let mut loaded = config::load(self.args.iter().cloned());
        if self.names_a_file_that_reads_empty(loaded.as_ref().ok()) {
            tracing::debug!(
                "a configuration file reads empty; reading it again in {EMPTY_FILE_SETTLE:?}"
            );
            std::thread::sleep(EMPTY_FILE_SETTLE);
            before = Reloader::stamps(&self.config);
            loaded = config::load(self.args.iter().cloned());
        }
        // Watch what the newest readable configuration names.
        self.watched = match &loaded {
            Ok(new) => Reloader::stamps(new)
                .into_iter()
                .map(|(path, now)| {
                    let seen = before.iter().find(|(p, _)| *p == path).map_or(now, |b| b.1);
                    (path, seen)
                })
                .collect(),
            Err(_) => before,
        };
        match loaded
            .map_err(|e| error_line(&e))
            .and_then(|new| self.apply(new))
        {
            Ok(changed) => {
                self.metrics.record(true);
                self.publisher.republish();
                if changed {
                    tracing::info!(cause, "configuration reloaded");
                } else {
                    tracing::info!(cause, "configuration reloaded, nothing changed");
                }
            }
            Err(message) => {
                self.metrics.record(false);
                self.publisher.republish();
                tracing::error!(
                    cause,
                    "configuration reload failed, the previous configuration stays in force: {message}"
                );
            }
        }
    }

    /// Reads the web-config `new` names, checks everything, then applies what can change.
    /// `Ok(true)` when something changed; `Err` names the file and the problem, and nothing is
    /// applied.
    fn apply(&mut self, mut new: Config) -> Result<bool, String> {
        let mut web = match &new.web_config {
            Some(path) => WebConfigFile::read(path).map_err(|e| e.to_string())?,
            None => WebConfigFile::default(),
        };
        let web_path = new.web_config.clone().unwrap_or_default();
        if let Some(refusal) = self.turns_security_off(&new, &web) {
            return Err(refusal);
        }
        for name in self.keep_restart_options(&mut new, &mut web) {
            tracing::warn!(
                "{name} changed in the configuration and needs a restart; the running value stays in force"
            );
        }
        // Everything that can fail, before anything is applied.
        let otlp = new.otlp_options().map_err(|e| e.to_string())?;
        let tls = match (&self.tls, &web.tls) {
            (Some(_), Some(settings)) if self.web.tls.as_ref() != Some(settings) => {
                Some(build_tls(&web_path, settings.clone()).map_err(|e| e.to_string())?)
            }
            _ => None,
        };
        // Turning basic auth off was refused above: a change names users.
        let auth = match &web.basic_auth_users {
            Some(users) if web.basic_auth_users != self.web.basic_auth_users => Some(Arc::new(
                build_auth(&web_path, users.clone()).map_err(|e| e.to_string())?,
            )),
            _ => None,
        };

        let otlp_changed = self.otlp.as_ref().map(|h| h.options()).as_deref() != otlp.as_ref();
        let changed = new != self.config || web != self.web || otlp_changed;
        let sampler = new.sampler_options();
        if *self.sampler.get() != sampler {
            self.sampler.set(sampler);
        }
        let kubernetes = new.kubernetes_options();
        if new.kubernetes != self.config.kubernetes
            || kubernetes != self.config.kubernetes_options()
        {
            let state = self.kubernetes.take().map(|k| k.state);
            self.kubernetes = new.kubernetes.then(|| {
                let state = match state {
                    Some(state) => {
                        state.reconfigure(&kubernetes);
                        state
                    }
                    None => StateHandle::new(&kubernetes),
                };
                (self.start_kubernetes)(&kubernetes, state)
            });
        }
        self.publisher.reconfigure(
            new.metrics_options(),
            self.kubernetes.as_ref().map(|k| k.state.clone()),
        );
        self.publisher.set_job_mapping_dir(new.job_mapping_dir());
        if otlp_changed {
            match (&self.otlp, otlp) {
                (Some(push), Some(options)) => push.reconfigure(options),
                (None, Some(options)) => self.otlp = Some((self.start_otlp)(options)),
                (_, None) => {
                    self.otlp = None;
                    tracing::info!("OTLP push off");
                }
            }
        }
        if let (Some(served), Some(tls)) = (&self.tls, tls) {
            served.replace(tls);
            tracing::info!("TLS settings reloaded");
        }
        if let Some(auth) = auth {
            tracing::info!(
                users = web.basic_auth_users.as_ref().map_or(0, |u| u.len()),
                "basic-auth users reloaded"
            );
            self.auth.replace(auth);
        }
        self.config = new;
        self.web = web;
        Ok(changed)
    }

    /// Why `new` and `web` must not be applied, when they would turn off basic auth or TLS that
    /// is in force: only a restart does that, so that a file caught empty or a `--config` that
    /// lost its `web_config` line never serves anyone without credentials or in clear text.
    fn turns_security_off(&self, new: &Config, web: &WebConfigFile) -> Option<String> {
        let mut dropped = Vec::new();
        if self.web.basic_auth_users.is_some() && web.basic_auth_users.is_none() {
            dropped.push("basic auth");
        }
        if self.tls.is_some() && web.tls.is_none() {
            dropped.push("TLS");
        }
        if dropped.is_empty() {
            return None;
        }
        let file = match (&new.web_config, &new.config_file) {
            (Some(path), _) => format!("--web-config {}", path.display()),
            (None, Some(path)) => format!("--config {} names no web_config", path.display()),
            (None, None) => "the configuration names no web_config".to_owned(),
        };
        Some(format!(
            "{file}: it would turn {} off, which only a restart does",
            dropped.join(" and ")
        ))
    }

    /// Whether a file of the configuration in force, or of `new`, reads empty: nothing but blank
    /// lines and comments, as a file being rewritten by a writer that truncates it first.
    fn names_a_file_that_reads_empty(&self, new: Option<&Config>) -> bool {
        [Some(&self.config), new]
            .into_iter()
            .flatten()
            .flat_map(|c| [c.config_file.as_ref(), c.web_config.as_ref()])
            .flatten()
            .any(|path| reads_empty(path))
    }

    /// Gives the options that need a restart ([`config::RESTART_OPTIONS`]) their running values
    /// back in `new` and `web`, and returns the names of those that the files changed.
    fn keep_restart_options(&self, new: &mut Config, web: &mut WebConfigFile) -> Vec<&'static str> {
        let mut changed = new.keep_restart_options(&self.config);
        // Not an option of a running exporter: a file may say it, and it means nothing here.
        new.once = self.config.once;
        // Turning TLS off was refused before: only turning it on is left.
        if web.tls.is_some() != self.tls.is_some() {
            changed.push("tls_server_config (turning TLS on)");
            web.tls = self.web.tls.clone();
        }
        changed
    }
}

/// Whether the file at `path` holds nothing but blank lines and `#` comments (the comment mark
/// of both TOML and YAML); a file that cannot be read is not empty, but an error of its own.
fn reads_empty(path: &std::path::Path) -> bool {
    crate::files::read_small_file(path).is_ok_and(|bytes| {
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::trim)
            .all(|line| line.is_empty() || line.starts_with('#'))
    })
}

/// A configuration error as one log line, without the "error: " that `main` prints.
fn error_line(e: &ConfigError) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// The next delivery of a watched signal; never, for one that is not watched.
async fn next(signal: &mut Option<Signal>) {
    if let Some(s) = signal {
        if s.recv().await.is_some() {
            return;
        }
        // No more deliveries can come.
        *signal = None;
    }
    std::future::pending::<()>().await
}

#[cfg(test)]
mod tests {
    use super::reads_empty;

    #[test]
    fn only_blank_lines_and_comments_read_empty() {
        let dir = tempfile::tempdir().unwrap();
        let file = |text: &str| {
            let path = dir.path().join("file");
            std::fs::write(&path, text).unwrap();
            path
        };
        for text in ["", "\n \n", "# users to come\n\n  # indented\n"] {
            assert!(reads_empty(&file(text)), "{text:?}");
        }
        for text in [
            "basic_auth_users:\n",
            "# a comment\ninterval = '2s'\n",
            "{}",
        ] {
            assert!(!reads_empty(&file(text)), "{text:?}");
        }
        assert!(!reads_empty(&dir.path().join("missing")));
    }
}
