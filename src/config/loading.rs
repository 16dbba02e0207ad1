//! Reading the configuration: the command line (with the `check-config` subcommand), the
//! `--config` file with the line of each key, the environment, and which of them gave each value,
//! so that an error names where the bad value came from. Also the warnings for `NVML_EXPORTER_*`
//! variables that are no option.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use serde::Deserialize;

use crate::files::{one_line, read_small_file};

use super::Config;
use super::collectors::check_collector_names;

/// The command line: the options, the file holding more of them, and the subcommand.
#[derive(Debug, Parser)]
#[command(
    name = "nvml-exporter",
    version,
    about = "Prometheus exporter for NVIDIA GPUs, reading NVML directly.",
    long_about = "Prometheus exporter for NVIDIA GPUs, reading NVML directly.\n\n\
        Samples every GPU on an interval and serves /metrics, /healthz, /readyz and a node page.\n\
        Every option can also be set in a TOML file (--config; key = option name with underscores,\n\
        e.g. nvml_lib = \"/usr/lib/libnvidia-ml.so.1\") and by an environment variable\n\
        NVML_EXPORTER_<OPTION> (e.g. NVML_EXPORTER_LISTEN). Precedence: defaults < file < environment < flags.\n\
        Durations are written like 1s, 500ms, 2m."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// TOML file with any of the options below
    #[arg(long, env = "NVML_EXPORTER_CONFIG", value_name = "FILE", global = true)]
    config: Option<PathBuf>,

    #[command(flatten)]
    options: Config,
}

/// The command line's parser, with what a reload applies said after the options.
fn command() -> clap::Command {
    let restart: Vec<String> = super::RESTART_OPTIONS
        .iter()
        .map(|key| format!("--{}", key.replace('_', "-")))
        .collect();
    Cli::command().after_help(format!(
        "SIGHUP, and a change of the --config or --web-config file or of a file the OTLP push \
         reads, reload the configuration, except these options, which need a restart: {}.",
        restart.join(", ")
    ))
}

/// Subcommands; without one the exporter serves.
#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Validate the configuration (flags, environment, --config file and --web-config file)
    /// without starting: prints "ok" (exit 0) or the error (exit 2)
    CheckConfig {
        /// TOML configuration file to check (the same as --config)
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
    },
}

/// A configuration that cannot be used. `main` prints it and exits with status 2.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// clap's own error (unknown flag, unparsable flag or environment value, `--help`, `--version`):
    /// it knows how to print itself and with which status to exit.
    #[error("{0}")]
    Cli(#[from] clap::Error),
    /// The file cannot be read or parsed, or a value is refused. The message names the option and
    /// where its value came from; it is shown on one line whatever the value holds.
    #[error("error: {}", one_line(.0))]
    Invalid(String),
}

/// Reads flags from `args` (including the program name) and options from the process environment
/// and the `--config` file, and validates the result.
pub fn load<I, T>(args: I) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<T> = args.into_iter().collect();
    check_collector_names(args.iter().cloned())?;
    let mut command = command();
    let mut matches = command.try_get_matches_from_mut(args)?;
    let cli = Cli::from_arg_matches(&matches)?;
    let check_config = cli.command.is_some();
    let file_path = match cli.command {
        Some(Command::CheckConfig {
            file: Some(positional),
        }) => {
            if let Some(flag) = &cli.config {
                return Err(ConfigError::Invalid(format!(
                    "check-config {} and --config {} name two files; give one",
                    positional.display(),
                    flag.display()
                )));
            }
            Some(positional)
        }
        _ => cli.config,
    };
    let (mut config, file) = match file_path {
        Some(path) => {
            let (config, lines) = read_file(&path)?;
            (config, Some(FileLines { path, lines }))
        }
        None => (Config::default(), None),
    };
    // A flag or variable beats the file; a default must not. clap fills in the defaults, so they
    // are taken out of the matches before the matches update what the file gave.
    let defaulted: Vec<String> = matches
        .ids()
        .map(|id| id.as_str().to_owned())
        .filter(|id| matches.value_source(id) == Some(ValueSource::DefaultValue))
        .collect();
    for id in &defaulted {
        // The ids come from these matches, so clearing them cannot fail.
        let _ = matches.try_clear_id(id);
    }
    config.update_from_arg_matches(&matches)?;
    config.check_config = check_config;
    config.config_file = file.as_ref().map(|f| f.path.clone());
    let origins = Origins {
        command: &command,
        matches: &matches,
        file: file.as_ref(),
    };
    config.validate(&origins)?;
    Ok(config)
}

/// Reads the `--config` file into a [`Config`], with the line of each key in it.
fn read_file(path: &Path) -> Result<(Config, HashMap<String, usize>), ConfigError> {
    let text = read_small_file(path)
        .and_then(|bytes| {
            String::from_utf8(bytes)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        })
        .map_err(|e| {
            ConfigError::Invalid(format!("--config: cannot read {}: {e}", path.display()))
        })?;
    let error = |e: toml::de::Error| {
        // toml gives no position for some errors (its nesting limit): then there is no line.
        let line = e
            .span()
            .map(|s| format!(" line {}", line_of(&text, s.start)))
            .unwrap_or_default();
        // The key the error is about, when toml can tell (it names unknown fields itself).
        let key = e
            .span()
            .and_then(|s| key_before(&text, s.start))
            .map(|k| format!(" (option {k})"))
            .unwrap_or_default();
        ConfigError::Invalid(format!(
            "--config {}{line}{key}: {}",
            path.display(),
            e.message().trim()
        ))
    };
    let table = toml::de::DeTable::parse(&text).map_err(error)?;
    let lines = table
        .get_ref()
        .iter()
        .map(|(key, value)| {
            (
                key.get_ref().to_string(),
                line_of(&text, value.span().start),
            )
        })
        .collect();
    let config = Config::deserialize(toml::de::Deserializer::from(table)).map_err(error)?;
    Ok((config, lines))
}

/// Variables named like options (`NVML_EXPORTER_*`) that are none, each with a warning naming it
/// and the closest option's variable if one is close: a mistyped variable would otherwise be
/// ignored without a word. `vars` are the names in the environment.
pub fn unknown_variables<I, S>(vars: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    const PREFIX: &str = "NVML_EXPORTER_";
    let command = Cli::command();
    let known: Vec<String> = command
        .get_arguments()
        .filter_map(clap::Arg::get_env)
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    let mut warnings = Vec::new();
    for var in vars {
        let var = var.as_ref().to_string_lossy();
        let Some(rest) = var.strip_prefix(PREFIX) else {
            continue;
        };
        if known.iter().any(|k| *k == var) || NOT_OPTIONS.contains(&var.as_ref()) {
            continue;
        }
        let closest = known
            .iter()
            .map(|k| (edit_distance(rest, &k[PREFIX.len()..]), k))
            .min()
            .filter(|(d, _)| *d <= 3);
        warnings.push(match closest {
            Some((_, k)) => format!(
                "environment variable {} is not an option and is ignored; did you mean {k}?",
                one_line(&var)
            ),
            None => format!(
                "environment variable {} is not an option and is ignored (see --help for the variables)",
                one_line(&var)
            ),
        });
    }
    warnings
}

/// `NVML_EXPORTER_*` variables that are not options but the project's own: the revision given to
/// the build, and the real NVML library given to the tests by scripts/test.sh.
const NOT_OPTIONS: &[&str] = &["NVML_EXPORTER_REVISION", "NVML_EXPORTER_TEST_REAL_NVML"];

/// Levenshtein distance between two names, for "did you mean".
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// 1-based line number of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The `key` of a `key = value` line containing `offset`, if that line is one.
fn key_before(text: &str, offset: usize) -> Option<String> {
    let start = text[..offset.min(text.len())]
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let line = text[start..].lines().next()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then(|| key.to_string())
}

/// The `--config` file's path and the line of each key in it.
struct FileLines {
    path: PathBuf,
    lines: HashMap<String, usize>,
}

/// Where each option's value came from, for error messages: clap's matches (a flag or a variable),
/// else the file, else the default.
pub(super) struct Origins<'a> {
    command: &'a clap::Command,
    matches: &'a ArgMatches,
    file: Option<&'a FileLines>,
}

impl Origins<'_> {
    fn arg(&self, id: &str) -> Option<&clap::Arg> {
        self.command.get_arguments().find(|arg| arg.get_id() == id)
    }

    pub(super) fn of(&self, id: &str) -> Origin {
        match self.matches.value_source(id) {
            Some(ValueSource::CommandLine) => Origin::Flag,
            Some(ValueSource::EnvVariable) => Origin::Env(
                self.arg(id)
                    .and_then(clap::Arg::get_env)
                    .map(|var| var.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
            _ => self
                .file
                .and_then(|file| {
                    let line = *file.lines.get(id)?;
                    Some(Origin::File {
                        path: file.path.clone(),
                        line,
                    })
                })
                .unwrap_or(Origin::Default),
        }
    }

    /// A refused value of the option `id`.
    pub(super) fn invalid(&self, id: &str, msg: String) -> ConfigError {
        let flag = self.arg(id).and_then(clap::Arg::get_long).unwrap_or(id);
        ConfigError::Invalid(format!(
            "invalid value for --{flag} ({}): {msg}",
            self.of(id)
        ))
    }
}

/// Where a value came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Origin {
    Default,
    Flag,
    Env(String),
    File { path: PathBuf, line: usize },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => write!(f, "default"),
            Origin::Flag => write!(f, "command line"),
            Origin::Env(var) => write!(f, "environment variable {var}"),
            Origin::File { path, line } => write!(f, "{} line {line}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{err, file, load_args};
    use crate::config::*;
    use crate::files::MAX_FILE_BYTES;

    #[test]
    fn every_option_has_one_name_as_flag_variable_and_file_key() {
        let mut command = Cli::command();
        command.build();
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            let flag = id.replace('_', "-");
            assert_eq!(arg.get_long(), Some(flag.as_str()), "{id}");
            // The hidden negation of a collector switch has no variable of its own.
            if id.starts_with("no-collector.") {
                continue;
            }
            let var = format!(
                "NVML_EXPORTER_{}",
                id.replace(['.', '-'], "_").to_uppercase()
            );
            assert_eq!(arg.get_env().and_then(|v| v.to_str()), Some(var.as_str()));
        }
    }

    #[test]
    fn the_file_beats_defaults_and_loses_to_flags() {
        let f = file(concat!(
            "kubernetes_labels = false\n",
            "kubernetes_resource_names = [\"a.io/gpu\"]\n",
            "host_proc = \"/h\"\n",
            "log_level = \"debug\"\n",
        ));
        let path = f.path().to_str().unwrap();
        let c = load_args(&["--config", path]).unwrap();
        assert!(!c.kubernetes_labels, "a default must not beat the file");
        assert_eq!(c.kubernetes_resource_names, ["a.io/gpu"]);
        assert_eq!(c.host_proc, PathBuf::from("/h"));
        assert_eq!(c.log_level, "debug");
        let c = load_args(&[
            "--config",
            path,
            "--kubernetes-labels",
            "--kubernetes-resource-names",
            "b.io/gpu",
            "--host-proc",
            "/f",
        ])
        .unwrap();
        assert!(c.kubernetes_labels);
        assert_eq!(c.kubernetes_resource_names, ["b.io/gpu"]);
        assert_eq!(c.host_proc, PathBuf::from("/f"));
        assert_eq!(c.log_level, "debug", "what no flag gave stays the file's");
    }

    #[test]
    fn flags_override_the_file() {
        let f = file("listen = \"127.0.0.1:1234\"\ninterval = \"2s\"\nlog_format = \"json\"\n");
        let c = load_args(&["--config", f.path().to_str().unwrap(), "--interval", "3s"]).unwrap();
        assert_eq!(c.listen, "127.0.0.1:1234".parse().unwrap());
        assert_eq!(c.interval, Duration::from_secs(3));
        assert_eq!(
            c.device_timeout(),
            Duration::from_secs(3),
            "device timeout follows the interval"
        );
        assert_eq!(c.log_format, LogFormat::Json);
    }

    #[test]
    fn bad_flag_value_names_the_option() {
        let e = err(&["--interval", "soon"]);
        assert!(e.contains("--interval") && e.contains("soon"), "{e}");
        let e = err(&["--interval", "5ms"]);
        assert!(e.contains("--interval") && e.contains("10ms"), "{e}");
        let e = err(&["--listen", "nowhere"]);
        assert!(e.contains("--listen"), "{e}");
        let e = err(&["--log-level", "info,=["]);
        assert!(e.contains("--log-level"), "{e}");
    }

    #[test]
    fn bad_file_value_names_option_and_line() {
        let f = file("# comment\nlisten = \":9400\"\ninterval = \"fast\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(
            e.contains("line 3") && e.contains("interval") && e.contains("fast"),
            "{e}"
        );

        // Parses, but out of range: still reported at its line.
        let f = file("stale_grace = \"1s\"\ninterval = \"2s\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(e.contains("--stale-grace") && e.contains("line 1"), "{e}");
    }

    #[test]
    fn unknown_file_key_is_an_error() {
        let f = file("intervall = \"1s\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(e.contains("intervall") && e.contains("line 1"), "{e}");
    }

    #[test]
    fn errors_stay_on_one_line_whatever_the_value() {
        // A value with a line break (a TOML escape) is shown escaped.
        let f = file("log_level = \"info\"\ninterval = \" \\n \"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(!e.contains('\n'), "{e:?}");
        assert!(
            e.contains("line 2") && e.contains("interval") && e.contains("\\n"),
            "{e}"
        );
        let f = file("log_format = \"js\\non\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(!e.contains('\n') && e.contains("log_format"), "{e:?}");
        let e = err(&["--log-level", "info\n=["]);
        assert!(!e.contains('\n') && e.contains("--log-level"), "{e:?}");
    }

    #[test]
    fn too_deep_nesting_is_an_error_without_a_made_up_line() {
        let f = file(&format!(
            "interval = {}{}\n",
            "[".repeat(1000),
            "]".repeat(1000)
        ));
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(!e.contains("line 0"), "{e}");
        assert!(e.contains(f.path().to_str().unwrap()), "{e}");
    }

    #[test]
    fn only_small_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; MAX_FILE_BYTES as usize + 1]).unwrap();
        let e = err(&["--config", big.to_str().unwrap()]);
        assert!(
            e.contains("big.toml") && e.contains("larger than 1024 KiB"),
            "{e}"
        );
        let exact = dir.path().join("exact.toml");
        std::fs::write(&exact, vec![b'#'; MAX_FILE_BYTES as usize]).unwrap();
        assert_eq!(
            read_small_file(&exact).unwrap().len() as u64,
            MAX_FILE_BYTES
        );

        let e = err(&["--config", dir.path().to_str().unwrap()]);
        assert!(e.contains("a directory, not a regular file"), "{e}");
        let e = read_small_file(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.to_string(), "a character device, not a regular file");
        let fifo = dir.path().join("fifo");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        // Opening a FIFO without a writer would block; it must not.
        let e = read_small_file(&fifo).unwrap_err();
        assert_eq!(e.to_string(), "a FIFO, not a regular file");
    }

    #[test]
    fn missing_file_is_an_error() {
        let e = err(&["--config", "/nonexistent/nvml-exporter.toml"]);
        assert!(
            e.contains("--config") && e.contains("/nonexistent/nvml-exporter.toml"),
            "{e}"
        );
    }

    #[test]
    fn unknown_variables_are_named_with_the_closest_option() {
        let warnings = unknown_variables([
            "NVML_EXPORTER_LISTEN",
            "NVML_EXPORTER_CONFIG",
            "NVML_EXPORTER_INTERVALL",
            "NVML_EXPORTER_WEBCONFIG",
            "NVML_EXPORTER_FROBNICATE",
            "NVML_EXPORTER_REVISION",
            "PATH",
        ]);
        assert_eq!(
            warnings,
            [
                "environment variable NVML_EXPORTER_INTERVALL is not an option and is ignored; \
                 did you mean NVML_EXPORTER_INTERVAL?",
                "environment variable NVML_EXPORTER_WEBCONFIG is not an option and is ignored; \
                 did you mean NVML_EXPORTER_WEB_CONFIG?",
                "environment variable NVML_EXPORTER_FROBNICATE is not an option and is ignored \
                 (see --help for the variables)",
            ]
        );
        assert_eq!(edit_distance("LISTEN", "LISTEN"), 0);
        assert_eq!(edit_distance("LISTN", "LISTEN"), 1);
        assert_eq!(edit_distance("", "AB"), 2);
    }

    #[test]
    fn web_config_from_flag_or_file() {
        let c = load_args(&["--web-config", "/etc/web.yml"]).unwrap();
        assert_eq!(c.web_config, Some(PathBuf::from("/etc/web.yml")));
        let f = file("web_config = \"/etc/other.yml\"\n");
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.web_config, Some(PathBuf::from("/etc/other.yml")));
        assert!(!c.check_config);
        let e = err(&["--web-config", ""]);
        assert!(e.contains("--web-config"), "{e}");
    }

    #[test]
    fn check_config_takes_the_file_as_argument_or_flag() {
        let f = file("interval = \"2s\"\n");
        let path = f.path().to_str().unwrap();
        let c = load_args(&["check-config", path]).unwrap();
        assert!(c.check_config);
        assert_eq!(c.interval, Duration::from_secs(2));
        let c = load_args(&["check-config", "--config", path, "--web-config", "w.yml"]).unwrap();
        assert!(c.check_config);
        assert_eq!(c.interval, Duration::from_secs(2));
        assert_eq!(c.web_config, Some(PathBuf::from("w.yml")));
        let e = err(&["check-config", path, "--config", path]);
        assert!(e.contains("check-config") && e.contains("--config"), "{e}");
    }

    #[test]
    fn a_global_flag_given_before_and_after_check_config_takes_the_later() {
        let c = load_args(&[
            "--web-config",
            "first.yml",
            "check-config",
            "--web-config",
            "second.yml",
        ])
        .unwrap();
        assert!(c.check_config);
        assert_eq!(c.web_config, Some(PathBuf::from("second.yml")));
    }

    #[test]
    fn boolean_flags_take_optional_values() {
        assert!(load_args(&["--once"]).unwrap().once);
        assert!(!load_args(&["--once=false"]).unwrap().once);
        assert_eq!(load_args(&["--demo"]).unwrap().nvml(), NvmlSource::Demo);
    }
}
