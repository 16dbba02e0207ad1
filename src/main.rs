//! The `nvml-exporter` executable: configuration → logging → [`nvml_exporter::run`]. The only
//! place that exits: status 2 for a bad flag, variable, config or web-config file; 1 when it
//! cannot serve. `check-config` stops after validation. SIGTERM and SIGINT stop it within
//! [`nvml_exporter::SHUTDOWN_GRACE`]; SIGHUP reloads the configuration
//! ([`nvml_exporter::reload`]), from the same command line and environment, and is ignored until
//! the exporter watches it.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};

use nvml_exporter::config::{self, Config, ConfigError, LogFormat};
use nvml_exporter::http::WebSettings;

fn main() -> ExitCode {
    limit_malloc_arenas();
    ignore_hangup_until_watched();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let config = match config::load(args.iter().cloned()) {
        Ok(config) => config,
        Err(ConfigError::Cli(e)) => {
            // `--help` and `--version` are "errors" that print to stdout and exit 0.
            let _ = e.print();
            return ExitCode::from(e.exit_code() as u8);
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // Certificates and hashes are checked here, before anything starts, so that a bad file is a
    // configuration error (status 2) and not a server that fails on its first connection.
    let web = match WebSettings::load(config.web_config.as_deref()) {
        Ok(web) => web,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if config.check_config {
        for warning in nvml_exporter::startup_warnings(Some(&web)) {
            eprintln!("warning: {warning}");
        }
        println!("ok");
        return ExitCode::SUCCESS;
    }
    init_tracing(&config);

    if config.once {
        let (text, nvml_up) = nvml_exporter::sample_once(&config);
        if std::io::stdout()
            .write_all(&text)
            .and_then(|()| std::io::stdout().flush())
            .is_err()
        {
            return ExitCode::from(1);
        }
        return if nvml_up {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        };
    }

    let workers = async_workers(std::thread::available_parallelism().ok());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(async {
        // Before listening: a SIGHUP from then on reloads.
        let mut signals = Signals::register();
        let reload = nvml_exporter::reload::Triggers {
            args,
            hangup: signals.hangup.take(),
        };
        let listener = match nvml_exporter::http::server::bind(config.listen) {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(address = %config.listen, error = %e, "cannot listen");
                return ExitCode::from(1);
            }
        };
        match listener.local_addr() {
            Ok(address) => tracing::info!(
                %address,
                tls = web.tls.is_some(),
                basic_auth = web.auth.is_some(),
                version = env!("CARGO_PKG_VERSION"),
                "listening"
            ),
            Err(e) => tracing::warn!(error = %e, "listening on an unknown address"),
        }
        match nvml_exporter::run(config, web, listener, signals.shutdown(), reload).await {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "exporter failed");
                ExitCode::from(1)
            }
        }
    });
    // `run` has stopped the server and the sampler within the grace. Blocking tasks still running
    // (a password check, a compression) are abandoned, not awaited: dropping the runtime would
    // wait for each to return, however long it takes.
    runtime.shutdown_timeout(Duration::ZERO);
    code
}

/// How many async workers serve HTTP: two are plenty, since a scrape copies bytes that the
/// sampler threads prepared; one where the process may use a single CPU (`available` counts the
/// CPUs of its affinity mask and its cgroup quota, so a Kubernetes CPU limit of 1 or less gives
/// 1), because two busy workers on one CPU take turns by scheduler time slices and the
/// connections of the one waiting wait a whole slice.
fn async_workers(available: Option<std::num::NonZeroUsize>) -> usize {
    available.map_or(2, |n| n.get().min(2))
}

/// glibc gives threads that allocate at the same time arenas of their own, up to eight per core,
/// and each keeps its freed memory. Here the reader threads allocate a little every tick, at the
/// same moment as each other, so arenas would multiply with the readers; two are plenty for
/// that traffic and keep the resident memory lower. Called first thing, before any thread exists.
#[allow(unsafe_code, reason = "mallopt is a C call")]
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; no other thread runs yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// SIGHUP's default action ends the process (status 129), and the signal is watched only once
/// the runtime runs: until then (and for `--once` and `check-config`, which never watch it) it is
/// ignored, so that a reload asked for while the exporter starts cannot kill it. Watching it later
/// replaces the ignoring.
#[allow(unsafe_code, reason = "signal(2) is a C call")]
fn ignore_hangup_until_watched() {
    // SAFETY: sets SIGHUP's disposition to the constant SIG_IGN, before any thread exists.
    unsafe {
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
}

fn init_tracing(config: &Config) {
    // The filter was validated with the configuration, so this cannot fail here.
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal: escape codes in a log file or shipper are noise.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match config.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The signals the exporter answers, each watched from registration on (a signal not watched
/// keeps its default action, which for all three is to end the process at once). SIGHUP is
/// handed to the configuration reload.
struct Signals {
    terminate: Option<Signal>,
    interrupt: Option<Signal>,
    hangup: Option<Signal>,
}

impl Signals {
    /// Watches SIGTERM, SIGINT and SIGHUP; one that cannot be watched is logged and left alone.
    /// Called on the runtime.
    fn register() -> Signals {
        let watch = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch {name}");
                None
            }
        };
        Signals {
            terminate: watch(SignalKind::terminate(), "SIGTERM"),
            interrupt: watch(SignalKind::interrupt(), "SIGINT"),
            hangup: watch(SignalKind::hangup(), "SIGHUP"),
        }
    }

    /// Completes on SIGTERM (Kubernetes, systemd) or SIGINT (Ctrl-C).
    async fn shutdown(mut self) {
        tokio::select! {
            () = next(&mut self.terminate) => tracing::info!("SIGTERM received, shutting down"),
            () = next(&mut self.interrupt) => tracing::info!("SIGINT received, shutting down"),
        }
    }
}

/// The next delivery of a watched signal; never, for one that is not watched.
async fn next(signal: &mut Option<Signal>) {
    if let Some(s) = signal {
        if s.recv().await.is_some() {
            return;
        }
        // No more deliveries can come: wait for the other signals.
        *signal = None;
    }
    std::future::pending::<()>().await
}

#[cfg(test)]
mod tests {
    use super::async_workers;
    use std::num::NonZeroUsize;

    #[test]
    fn one_async_worker_on_one_cpu_two_otherwise() {
        let cpus = |n| NonZeroUsize::new(n);
        assert_eq!(async_workers(cpus(1)), 1);
        assert_eq!(async_workers(cpus(2)), 2);
        assert_eq!(async_workers(cpus(64)), 2);
        assert_eq!(
            async_workers(None),
            2,
            "unknown: as many as the usual node gives"
        );
    }
}
