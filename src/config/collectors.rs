//! The collector switches: `--collector.NAME`, `--no-collector.NAME` and
//! `--collector.disable-defaults`, made from the group list ([`crate::groups`]) by a hand-written
//! clap `Args` impl (the derive cannot make one flag per group), with their variables and the
//! file's `collector` table.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches};
use serde::{Deserialize, Deserializer};

use crate::files::one_line;
use crate::groups::{Group, Groups, valid_names};

use super::ConfigError;
use super::values::quote;

/// `--collector.NAME[=BOOL]`, `--no-collector.NAME` and `--collector.disable-defaults`: which
/// collector groups ([`crate::groups`]) are on. The flags are made from the group list;
/// each has a variable (`NVML_EXPORTER_COLLECTOR_NVLINK_LINKS=true`) and a key of the file's
/// `collector` table (`collector.nvlink-links = true`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Collectors {
    /// Start from no group: only those switched on are collected.
    pub disable_defaults: bool,
    /// Groups switched on (true) or off (false) by name.
    pub switched: BTreeMap<Group, bool>,
}

/// The name of `--collector.disable-defaults` after `collector.`.
const DISABLE_DEFAULTS: &str = "disable-defaults";

/// The argument ids of one switch: `collector.NAME` (also its long flag), `no-collector.NAME`,
/// and the variable.
struct SwitchIds {
    group: Option<Group>,
    on: &'static str,
    off: &'static str,
    env: &'static str,
}

/// The ids of every switch, `disable-defaults` first: made once, as clap keeps `&'static str`s.
fn switch_ids() -> &'static [SwitchIds] {
    static IDS: OnceLock<Vec<SwitchIds>> = OnceLock::new();
    IDS.get_or_init(|| {
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        std::iter::once((None, DISABLE_DEFAULTS))
            .chain(Group::switchable().map(|g| (Some(g.group), g.name)))
            .map(|(group, name)| SwitchIds {
                group,
                on: leak(format!("collector.{name}")),
                off: leak(format!("no-collector.{name}")),
                env: leak(format!(
                    "NVML_EXPORTER_COLLECTOR_{}",
                    name.replace('-', "_").to_uppercase()
                )),
            })
            .collect()
    })
}

impl Collectors {
    /// The groups on: the defaults (none with `disable_defaults`) and `also`, then the switches.
    pub fn groups(&self, also: Groups) -> Groups {
        let mut groups = if self.disable_defaults {
            Groups::none()
        } else {
            Groups::defaults()
        }
        .union(also);
        for (group, on) in &self.switched {
            groups = if *on {
                groups.with(*group)
            } else {
                groups.without(*group)
            };
        }
        groups
    }
}

/// The error for a group name that is none.
fn unknown_group(name: &str) -> String {
    format!(
        "unknown collector group {}; the groups are: {}",
        quote(name),
        valid_names()
    )
}

/// Refuses `--collector.NAME` / `--no-collector.NAME` flags and `NVML_EXPORTER_COLLECTOR_*`
/// variables that name no group, listing the valid names (clap would only say "unexpected
/// argument", and an unknown variable would be ignored with a warning).
pub(super) fn check_collector_names<I, T>(args: I) -> Result<(), ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString>,
{
    for arg in args {
        let arg = arg.into();
        let Some(arg) = arg.to_str() else { continue };
        let (flag, name) = match arg
            .strip_prefix("--collector.")
            .map(|n| ("--collector.", n))
            .or_else(|| {
                arg.strip_prefix("--no-collector.")
                    .map(|n| ("--no-collector.", n))
            }) {
            Some((flag, rest)) => (flag, rest.split('=').next().unwrap_or(rest)),
            None => continue,
        };
        let known = switch_ids().iter().any(|s| {
            (s.group.is_some() || flag == "--collector.") && s.on == format!("collector.{name}")
        });
        if !known {
            return Err(ConfigError::Invalid(format!(
                "{flag}{name} (command line): {}",
                unknown_group(name)
            )));
        }
    }
    const PREFIX: &str = "NVML_EXPORTER_COLLECTOR_";
    for (var, _) in std::env::vars_os() {
        let Some(var) = var.to_str() else { continue };
        if let Some(rest) = var.strip_prefix(PREFIX)
            && !switch_ids().iter().any(|s| s.env == var)
        {
            return Err(ConfigError::Invalid(format!(
                "environment variable {}: {}",
                one_line(var),
                unknown_group(&rest.to_lowercase().replace('_', "-"))
            )));
        }
    }
    Ok(())
}

impl clap::FromArgMatches for Collectors {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut c = Collectors::default();
        c.update_from_arg_matches(matches)?;
        Ok(c)
    }

    /// A flag or variable given replaces the file's value; `--no-collector.NAME` beats a
    /// variable (flags beat the environment), and of two flags of a group the later wins.
    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        for s in switch_ids() {
            let off = matches!(matches.try_get_one::<bool>(s.off), Ok(Some(true)))
                && matches.value_source(s.off) == Some(ValueSource::CommandLine);
            let on = match matches.try_get_one::<bool>(s.on) {
                Ok(Some(v)) if matches.value_source(s.on) != Some(ValueSource::DefaultValue) => {
                    Some(*v)
                }
                _ => None,
            };
            let value = if off { Some(false) } else { on };
            match (s.group, value) {
                (_, None) => {}
                (None, Some(v)) => self.disable_defaults = v,
                (Some(g), Some(v)) => {
                    self.switched.insert(g, v);
                }
            }
        }
        Ok(())
    }
}

impl clap::Args for Collectors {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for s in switch_ids() {
            let (help, long_help) = match s.group {
                None => (
                    "Start from no collector group: only those turned on with --collector.NAME are collected".to_string(),
                    "Start from no collector group: only those turned on with --collector.NAME are \
                     collected. Each group below is turned on with --collector.NAME and off with \
                     --no-collector.NAME; with --dcgm-compat every group that dcgm-exporter's \
                     fields come from is sampled unless turned off".to_string(),
                ),
                Some(g) => {
                    let info = g.info();
                    let text = format!(
                        "Collect the {} group: {} [default: {}]",
                        info.name,
                        info.help,
                        if info.default { "on" } else { "off" }
                    );
                    (text.clone(), text)
                }
            };
            cmd = cmd
                .arg(
                    clap::Arg::new(s.on)
                        .long(s.on)
                        .env(s.env)
                        .value_name("BOOL")
                        .value_parser(clap::value_parser!(bool))
                        .action(ArgAction::Set)
                        .num_args(0..=1)
                        .default_missing_value("true")
                        .require_equals(true)
                        .help(help)
                        .long_help(long_help)
                        .help_heading("Collectors")
                        .overrides_with(s.off),
                )
                .arg(
                    clap::Arg::new(s.off)
                        .long(s.off)
                        .action(ArgAction::SetTrue)
                        .hide(true)
                        .overrides_with(s.on),
                );
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl<'de> Deserialize<'de> for Collectors {
    /// The file's `collector` table: `disable-defaults` and group names, each a boolean.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut c = Collectors::default();
        for (name, on) in BTreeMap::<String, bool>::deserialize(d)? {
            if name == DISABLE_DEFAULTS {
                c.disable_defaults = on;
                continue;
            }
            let group = Group::from_name(&name)
                .filter(|g| *g != Group::Core)
                .ok_or_else(|| D::Error::custom(unknown_group(&name)))?;
            c.switched.insert(group, on);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{err, file, load_args};

    #[test]
    fn collector_groups_from_defaults_dcgm_compat_and_switches() {
        assert_eq!(load_args(&[]).unwrap().groups(), Groups::defaults());
        let c = load_args(&["--collector.disable-defaults", "--collector.nvlink-links"]).unwrap();
        assert_eq!(c.groups(), Groups::none().with(Group::NvlinkLinks));
        // --dcgm-compat samples what dcgm-exporter's fields come from, unless turned off by name;
        // the native families served stay those of the groups on.
        let c = load_args(&["--dcgm-compat=both"]).unwrap();
        let sampled = c.sampler_options().groups;
        assert!(sampled.contains(Group::Clocks) && sampled.contains(Group::ClockEvents));
        assert!(
            !sampled.contains(Group::NvlinkLinks),
            "no DCGM field is per link"
        );
        assert_eq!(c.groups(), Groups::defaults());
        let c = load_args(&["--dcgm-compat", "--no-collector.clocks"]).unwrap();
        assert!(!c.sampler_options().groups.contains(Group::Clocks));
        let c = load_args(&[]).unwrap();
        assert_eq!(c.sampler_options().groups, Groups::defaults());
        let c = load_args(&["--collector.memory=false"]).unwrap();
        assert!(!c.groups().contains(Group::Memory));
        let f = file("collector.disable-defaults = true\ncollector.power = true\n");
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.groups(), Groups::none().with(Group::Power));
        let c = load_args(&[
            "--config",
            f.path().to_str().unwrap(),
            "--collector.disable-defaults=false",
        ])
        .unwrap();
        assert_eq!(c.groups(), Groups::defaults());
        let f = file("collector.power = 1\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(e.contains("line 1"), "{e}");
    }
}
