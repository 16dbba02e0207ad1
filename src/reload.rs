//! Reloading the configuration without a restart: on SIGHUP, and when the `--config` or
//! `--web-config` file changes on disk.
//!
//! Every [`FILE_CHECK`] the device, inode, size, modification and change times of both files are
//! compared with the last seen (as the TLS reloader does for certificates), through the path
//! each time: a Kubernetes ConfigMap or Secret volume swaps a symlink to a new directory, so the
//! file the path names is a new inode. A reload runs the same loading as the start, with the
//! original command line and environment, so the precedence defaults < file < environment <
//! flags holds (a flag still beats the file), and reads the web-config file the result names.
//!
//! What can change applies as a whole, or nothing does: everything is read and checked first
//! (options, bcrypt hashes, certificate and key), then applied. Applied at run time: the encoder's
//! options ([`crate::metrics_options`]: the last tick is encoded again at once), the sampler's
//! options ([`crate::sampler_options`], from the next tick), the Kubernetes options (the refresh
//! task restarts; the kubelet state and its counters carry on), the basic-auth users (turning
//! basic auth on or off too) and the TLS settings and files. What was set up once at the start
//! needs a restart: the listening socket (`listen`), the NVML library (`nvml_lib`, `demo`), the
//! sampling schedule (`interval`, `device_timeout`, `stale_grace`, which the readiness rule and
//! several defaults follow), logging (`log_format`, `log_level`) and turning TLS on or off. A
//! change of those is logged as needing a restart, and they keep their running values.
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

use tokio::signal::unix::Signal;
use tokio::sync::watch;

use crate::config::{self, Config, ConfigError};
use crate::http::auth::{AuthSwitch, BasicAuth};
use crate::http::tls::{Stamp, TlsReloader};
use crate::http::web_config::{WebConfigError, WebConfigFile};
use crate::kubernetes::{StateHandle, Watcher};
use crate::publish::Publisher;
use crate::sampler::LiveOptions;

/// How often the files' metadata is compared with the last seen. A kubelet updates a mounted
/// ConfigMap within about a minute, so a few seconds more do not matter.
pub const FILE_CHECK: Duration = Duration::from_secs(2);

/// What starts a reload: SIGHUP, and the command line to load the configuration from again.
#[derive(Debug)]
pub struct Triggers {
    /// The process's arguments, program name included, as given at start.
    pub args: Vec<OsString>,
    /// SIGHUP deliveries; `None` when the signal cannot be watched (files are still watched).
    pub hangup: Option<Signal>,
}

/// The kubelet state and its refresh task, with `--kubernetes`.
pub(crate) struct Kubelet {
    /// The latest answer, shared with the publisher.
    pub state: StateHandle,
    /// Refreshes `state`; stops when dropped.
    _watcher: Watcher,
}

impl Kubelet {
    /// Refreshes `state` as `config` says, publishing every change of assignments at once (on a
    /// blocking thread, since it encodes). Called on the runtime.
    pub(crate) fn start(config: &Config, state: StateHandle, publisher: &Arc<Publisher>) -> Self {
        let publisher = Arc::clone(publisher);
        let watcher = Watcher::spawn(config, state.clone(), move || {
            let publisher = Arc::clone(&publisher);
            tokio::task::spawn_blocking(move || publisher.republish());
        });
        Kubelet {
            state,
            _watcher: watcher,
        }
    }
}

/// The configuration in force and the parts of the running exporter that a reload changes.
pub(crate) struct Reloader {
    pub args: Vec<OsString>,
    pub config: Config,
    pub web: WebConfigFile,
    pub publisher: Arc<Publisher>,
    pub sampler: LiveOptions,
    pub kubelet: Option<Kubelet>,
    pub auth: Arc<AuthSwitch>,
    /// The TLS served, when it is on (turning it on or off needs a restart).
    pub tls: Option<Arc<TlsReloader>>,
    /// The files watched, with their stamps when last read.
    pub watched: Vec<(PathBuf, Option<Stamp>)>,
}

/// Why a reload runs.
#[derive(Debug, Clone, Copy)]
enum Cause {
    Hangup,
    /// Time to look at the files.
    Check,
}

impl Reloader {
    /// The files `config` reads, with their stamps now.
    pub(crate) fn stamps(config: &Config) -> Vec<(PathBuf, Option<Stamp>)> {
        [config.config_file.as_ref(), config.web_config.as_ref()]
            .into_iter()
            .flatten()
            .map(|path| (path.clone(), Stamp::of_path(path)))
            .collect()
    }

    /// Reloads on SIGHUP and when a watched file changes, until `stop` turns true. The work
    /// (reading files, encoding) runs on a blocking thread.
    pub(crate) async fn watch(
        mut self,
        mut hangup: Option<Signal>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
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
                self.run(cause);
                self
            })
            .await
            {
                Ok(reloader) => self = reloader,
                Err(e) => {
                    tracing::error!(error = %e, "the configuration reload failed; no more reloads");
                    return;
                }
            }
        }
    }

    fn run(&mut self, cause: Cause) {
        match cause {
            Cause::Hangup => self.reload("SIGHUP"),
            Cause::Check => {
                let changed = self
                    .watched
                    .iter()
                    .find(|(path, seen)| Stamp::of_path(path) != *seen)
                    .map(|(path, _)| path.display().to_string());
                if let Some(path) = changed {
                    self.reload(&format!("{path} changed"));
                }
            }
        }
    }

    /// Loads the configuration again and applies it, or keeps the one in force; records the
    /// outcome in the reload metrics.
    pub(crate) fn reload(&mut self, cause: &str) {
        // Stamped before reading, so that a write during the read is seen at the next check.
        let before = Reloader::stamps(&self.config);
        let loaded = config::load(self.args.iter().cloned());
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
                self.publisher.record_reload(true);
                if changed {
                    tracing::info!(cause, "configuration reloaded");
                } else {
                    tracing::info!(cause, "configuration reloaded, nothing changed");
                }
            }
            Err(message) => {
                self.publisher.record_reload(false);
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
        for name in self.keep_restart_options(&mut new, &mut web) {
            tracing::warn!(
                "{name} changed in the configuration and needs a restart; the running value stays in force"
            );
        }
        // Everything that can fail, before anything is applied.
        let tls = match (&self.tls, &web.tls) {
            (Some(_), Some(settings)) if self.web.tls.as_ref() != Some(settings) => {
                Some(TlsReloader::new(settings.clone()).map_err(|error| {
                    WebConfigError::Tls {
                        path: web_path.clone(),
                        error: Box::new(error),
                    }
                    .to_string()
                })?)
            }
            _ => None,
        };
        let auth = if web.basic_auth_users == self.web.basic_auth_users {
            None
        } else {
            let auth = web
                .basic_auth_users
                .clone()
                .map(|users| BasicAuth::new(users).map(Arc::new))
                .transpose()
                .map_err(|error| {
                    WebConfigError::Auth {
                        path: web_path.clone(),
                        error,
                    }
                    .to_string()
                })?;
            Some(auth)
        };

        let changed = new != self.config || web != self.web;
        let sampler = crate::sampler_options(&new);
        if *self.sampler.get() != sampler {
            self.sampler.set(sampler);
        }
        if kubelet_settings(&new) != kubelet_settings(&self.config) {
            let state = self.kubelet.take().map(|k| k.state);
            self.kubelet = new.kubernetes.then(|| {
                let state = match state {
                    Some(state) => {
                        state.reconfigure(&new);
                        state
                    }
                    None => StateHandle::new(&new),
                };
                Kubelet::start(&new, state, &self.publisher)
            });
        }
        self.publisher.reconfigure(
            crate::metrics_options(&new),
            self.kubelet.as_ref().map(|k| k.state.clone()),
        );
        self.publisher.set_job_mapping_dir(new.job_mapping_dir());
        if let (Some(served), Some(tls)) = (&self.tls, tls) {
            served.replace(tls);
            tracing::info!("TLS settings reloaded");
        }
        if let Some(auth) = auth {
            match &auth {
                Some(_) => tracing::info!(
                    users = web.basic_auth_users.as_ref().map_or(0, |u| u.len()),
                    "basic-auth users reloaded"
                ),
                None => tracing::warn!(
                    "the reloaded web-config has no basic_auth_users: serving without credentials"
                ),
            }
            self.auth.replace(auth);
        }
        self.config = new;
        self.web = web;
        Ok(changed)
    }

    /// Gives the options that need a restart their running values back in `new` and `web`, and
    /// returns the names of those that the files changed.
    fn keep_restart_options(&self, new: &mut Config, web: &mut WebConfigFile) -> Vec<&'static str> {
        let old = &self.config;
        let mut changed = Vec::new();
        macro_rules! keep {
            ($($field:ident),*) => {$(
                if new.$field != old.$field {
                    changed.push(stringify!($field));
                    new.$field = old.$field.clone();
                }
            )*};
        }
        keep!(
            listen,
            nvml_lib,
            demo,
            interval,
            device_timeout,
            stale_grace,
            log_format,
            log_level
        );
        // Not an option of a running exporter: a file may say it, and it means nothing here.
        new.once = old.once;
        if web.tls.is_some() != self.tls.is_some() {
            changed.push("tls_server_config (turning TLS on or off)");
            web.tls = self.web.tls.clone();
        }
        changed
    }
}

/// What the kubelet refresh task is built from: when it differs, the task restarts.
fn kubelet_settings(c: &Config) -> impl PartialEq + '_ {
    (
        c.kubernetes,
        (&c.pod_resources_socket, &c.kubernetes_resource_names),
        (c.kubernetes_refresh(), c.kubernetes_timeout),
        (&c.kubelet_url, &c.kubelet_token_file, &c.kubelet_ca_file),
        (c.kubelet_insecure_tls, c.fetch_pods()),
        (&c.kubernetes_pod_labels, &c.kubernetes_pod_annotations),
        (
            c.kubernetes_dra,
            &c.kubernetes_dra_driver,
            &c.kubernetes_node_name,
        ),
        (c.kubernetes_api_url(), &c.kubernetes_api_ca_file),
    )
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
