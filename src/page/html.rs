//! The node page's HTML, rendered from a [`NodeView`] by the server: it reads without
//! JavaScript, and `page.js` only fetches it again and swaps it in.
//!
//! Colour is never the only signal: every mark and state is a word with a symbol, and every bar
//! (`<meter>`) has its number beside it. Each number also sits in a `data-value` attribute, raw
//! as `/api/v1/gpus` gives it, under a `data-field` named as there, for scripts and the browser
//! test. The readings are laid out as [`super::fields`] says of each.

use std::fmt::Write;

use super::fields::{Readings, Shown};
use super::view::{DeviceState, GpuView, Holder, Mark, MigInstanceView, NodeView};

/// The page's style: small, no web font, light and dark by `prefers-color-scheme`.
const STYLE: &str = include_str!("page.css");

/// How often `page.js` fetches the page again.
const REFRESH_MS: u32 = 2000;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The whole page.
pub fn render(view: &NodeView) -> String {
    let mut out = String::with_capacity(16 * 1024 + view.gpus.len() * 3 * 1024);
    out.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"color-scheme\" content=\"light dark\">\n\
         <link rel=\"icon\" href=\"data:,\">\n<title>",
    );
    escape(&mut out, &view.node);
    out.push_str(" · nvml-exporter</title>\n<style>\n");
    out.push_str(STYLE);
    out.push_str("</style>\n<script src=\"/page.js\" defer></script>\n</head>\n<body>\n");
    let _ = writeln!(
        out,
        "<main id=\"node\" data-refresh-ms=\"{REFRESH_MS}\" data-tick=\"{}\">",
        view.last_tick_timestamp_seconds.unwrap_or(0.0)
    );
    header(&mut out, view);
    if let Some(e) = &view.nvml_error {
        out.push_str("<p class=\"flag bad banner\" role=\"alert\">✖ NVML not available: ");
        escape(&mut out, e);
        out.push_str("</p>\n");
    }
    node_health(&mut out, view);
    let _ = write!(
        out,
        "<section class=\"gpus\" aria-label=\"GPUs\">\n<h2 class=\"count\">{} GPU{}</h2>\n",
        view.gpus.len(),
        if view.gpus.len() == 1 { "" } else { "s" }
    );
    for gpu in &view.gpus {
        gpu_card(&mut out, gpu);
    }
    out.push_str("</section>\n");
    legend(&mut out, view);
    out.push_str("</main>\n</body>\n</html>\n");
    out
}

fn header(out: &mut String, view: &NodeView) {
    out.push_str("<header>\n<h1>");
    escape(out, &view.node);
    out.push_str("</h1>\n<p class=\"facts\">driver <b>");
    escape(out, or_unknown(&view.driver_version));
    out.push_str("</b> · CUDA <b>");
    escape(out, or_unknown(&view.cuda_driver_version));
    let _ = write!(
        out,
        "</b> · nvml-exporter <b>{}</b> · last tick <b id=\"age\">",
        view.exporter_version
    );
    match view.last_tick_age_seconds {
        Some(age) => {
            let _ = write!(out, "{age:.1} s ago");
        }
        None => out.push_str("none yet"),
    }
    if let Some(missing) = &view.missing_gpus {
        let _ = write!(
            out,
            "</b> · GPUs on the PCI bus NVML does not list <b id=\"gpus-missing\">{}",
            missing.len()
        );
    }
    out.push_str("</b></p>\n<p class=\"facts\">collector groups: ");
    out.push_str(&view.collector_groups.join(", "));
    out.push_str(
        "</p>\n<nav><a href=\"/metrics\">/metrics</a> · <a href=\"/healthz\">/healthz</a> · \
         <a href=\"/readyz\">/readyz</a> · <a href=\"/api/v1/gpus\">/api/v1/gpus</a> (this \
         page as JSON)</nav>\n</header>\n",
    );
}

/// The node's own verdict when it is not healthy (a GPU the PCI bus lists that NVML does not
/// enumerate), with the GPUs it names; nothing while it is healthy or unknown.
fn node_health(out: &mut String, view: &NodeView) {
    let Some(h) = view.node_health.as_ref().filter(|h| h.state != "healthy") else {
        return;
    };
    let (class, symbol) = if h.state == "degraded" {
        ("warn", "▲")
    } else {
        ("bad", "✖")
    };
    let _ = write!(
        out,
        "<p class=\"flag {class} banner\" role=\"alert\" id=\"node-health\" \
         data-field=\"node_health\" data-value=\"{0}\">{symbol} node {0}:",
        h.state
    );
    for r in &h.reasons {
        let _ = write!(
            out,
            " <span class=\"reason\" data-reason=\"{0}\">{0} (action: {1})</span>",
            r.reason, r.action
        );
    }
    if let Some(missing) = view.missing_gpus.as_ref().filter(|m| !m.is_empty()) {
        let _ = write!(
            out,
            " · {} GPU{} on the PCI bus that NVML does not list:",
            missing.len(),
            if missing.len() == 1 { "" } else { "s" }
        );
        for g in missing {
            out.push_str(" <span class=\"missing-gpu\" data-pci-bus-id=\"");
            escape(out, &g.pci_bus_id);
            out.push_str("\">");
            escape(out, &g.pci_bus_id);
            out.push_str(" (");
            escape(out, &g.device_id);
            out.push_str(", driver ");
            escape(
                out,
                if g.driver.is_empty() {
                    "none"
                } else {
                    &g.driver
                },
            );
            out.push_str(")</span>");
        }
    }
    out.push_str("</p>\n");
}

fn gpu_card(out: &mut String, gpu: &GpuView) {
    let state = gpu.state.name();
    let _ = write!(
        out,
        "<article class=\"gpu\" id=\"gpu-{0}\" data-gpu=\"{0}\" data-state=\"{state}\" \
         data-marks=\"{1}\">\n<h3>GPU {0} <span class=\"name\">",
        gpu.gpu,
        mark_names(&gpu.marks)
    );
    escape(out, &gpu.name);
    out.push_str("</span></h3>\n<p class=\"uuid\">");
    escape(out, &gpu.uuid);
    out.push_str("</p>\n<p class=\"flags\">");
    match gpu.state {
        DeviceState::Up => {}
        DeviceState::Stale => {
            out.push_str("<span class=\"flag warn\">◷ stale: values from an earlier tick</span> ")
        }
        DeviceState::Down => out.push_str(
            "<span class=\"flag bad\">✖ down: lost, or no fresh reading (see health)</span> ",
        ),
    }
    marks(out, &gpu.marks);
    flags(out, &gpu.readings);
    if gpu.mig_mode == Some(true) {
        out.push_str("<span class=\"flag\">MIG mode</span> ");
    }
    out.push_str("</p>\n");
    readings(out, &gpu.readings);
    owners(out, &gpu.holders, &gpu.jobs, gpu.allocated);
    if let Some(h) = &gpu.health {
        let symbol = match h.state {
            "healthy" => "✓",
            "degraded" => "▲",
            _ => "✖",
        };
        let _ = write!(
            out,
            "<p class=\"health\">health <span class=\"flag {}\" data-field=\"health\" \
             data-value=\"{}\">{symbol} {}</span>",
            match h.state {
                "healthy" => "good",
                "degraded" => "warn",
                _ => "bad",
            },
            h.state,
            h.state
        );
        for r in &h.reasons {
            let _ = write!(
                out,
                " <span class=\"reason\" data-reason=\"{0}\">{0} (action: {1})</span>",
                r.reason,
                r.action.replace('_', " ")
            );
        }
        out.push_str("</p>\n");
    }
    if !gpu.mig_instances.is_empty() {
        out.push_str("<section class=\"mig\" aria-label=\"MIG instances\">\n");
        for instance in &gpu.mig_instances {
            mig_card(out, instance);
        }
        out.push_str("</section>\n");
    }
    out.push_str("</article>\n");
}

fn mig_card(out: &mut String, i: &MigInstanceView) {
    let _ = write!(
        out,
        "<article class=\"instance\" data-gpu-instance=\"{0}\" data-marks=\"{1}\">\n\
         <h4>instance {0} <span class=\"name\">",
        i.gpu_instance,
        mark_names(&i.marks)
    );
    escape(out, &i.profile);
    out.push_str("</span></h4>\n");
    if !i.marks.is_empty() || flagged(&i.readings) {
        out.push_str("<p class=\"flags\">");
        marks(out, &i.marks);
        flags(out, &i.readings);
        out.push_str("</p>\n");
    }
    readings(out, &i.readings);
    owners(out, &i.holders, &i.jobs, i.allocated);
    out.push_str("</article>\n");
}

/// The marks as `data-marks` holds them: their JSON names, space-separated.
fn mark_names(marks: &[Mark]) -> String {
    marks.iter().map(|m| m.name()).collect::<Vec<_>>().join(" ")
}

fn marks(out: &mut String, marks: &[Mark]) {
    for m in marks {
        let _ = write!(out, "<span class=\"flag warn mark\">▲ {}</span> ", m.text());
    }
}

/// The flags of the fields that are on.
fn flags(out: &mut String, r: &Readings) {
    for (field, value) in r.iter() {
        if let Shown::Flag { text } = field.shown {
            if value == Some(1.0) {
                let _ = write!(out, "<span class=\"flag warn\">▲ {text}</span> ");
            }
        }
    }
}

/// Whether a field's flag is on.
fn flagged(r: &Readings) -> bool {
    r.iter()
        .any(|(field, value)| matches!(field.shown, Shown::Flag { .. }) && value == Some(1.0))
}

/// The fields with a value: the bars (ratios, then each value against its end), each with its
/// number, then the lines under them.
fn readings(out: &mut String, r: &Readings) {
    out.push_str("<table class=\"bars\">\n");
    for (field, value) in r.iter() {
        let Some(v) = value else { continue };
        let name = field.name;
        match field.shown {
            Shown::Ratio { label } => {
                let _ = writeln!(
                    out,
                    "<tr><th scope=\"row\">{label}</th><td><meter min=\"0\" max=\"1\" value=\"{v}\"></meter></td>\
                     <td data-field=\"{name}\" data-value=\"{v}\">{:.0}%</td></tr>",
                    v * 100.0
                );
            }
            Shown::Bar { label, max, unit } => {
                let max = r.get(max).map(|m| (max, m));
                let _ = write!(out, "<tr><th scope=\"row\">{label}</th><td>");
                if let Some((_, m)) = max {
                    let _ = write!(out, "<meter min=\"0\" max=\"{m}\" value=\"{v}\"></meter>");
                }
                let _ = write!(
                    out,
                    "</td><td><span data-field=\"{name}\" data-value=\"{v}\">{}</span>",
                    unit.number(v)
                );
                if let Some((max, m)) = max {
                    let _ = write!(
                        out,
                        " / <span data-field=\"{max}\" data-value=\"{m}\">{}</span>",
                        unit.number(m)
                    );
                }
                let _ = writeln!(out, " {}</td></tr>", unit.symbol());
            }
            Shown::Max | Shown::Line { .. } | Shown::Flag { .. } => {}
        }
    }
    out.push_str("</table>\n");
    for (field, value) in r.iter() {
        if let (Shown::Line { label, unit }, Some(v)) = (field.shown, value) {
            let _ = writeln!(
                out,
                "<p>{label} <span data-field=\"{}\" data-value=\"{v}\">{} {}</span></p>",
                field.name,
                unit.number(v),
                unit.symbol()
            );
        }
    }
}

fn owners(out: &mut String, holders: &[Holder], jobs: &[String], allocated: bool) {
    out.push_str("<p class=\"owner\">");
    if holders.is_empty() && jobs.is_empty() {
        out.push_str(if allocated {
            "held by processes outside any pod"
        } else {
            "not held"
        });
    } else {
        out.push_str("held by");
        for h in holders {
            out.push_str(" <span class=\"holder\">");
            escape(out, &h.namespace);
            out.push('/');
            escape(out, &h.pod);
            out.push_str(" (");
            escape(out, &h.container);
            out.push_str(")</span>");
        }
        for j in jobs {
            out.push_str(" <span class=\"holder\">job ");
            escape(out, j);
            out.push_str("</span>");
        }
    }
    out.push_str("</p>\n");
}

fn legend(out: &mut String, view: &NodeView) {
    let t = &view.thresholds;
    let _ = write!(
        out,
        "<footer>\n<p><b>▲ busy, not saturated</b>: kernels ran at least {}% of the time while \
         fewer than {}% of the SMs were active (NvidiaGpuLowSaturation). \
         <b>▲ allocated, idle</b>: held by a pod (where no pod holds a GPU of this node: its \
         processes hold more than {} GiB) with SM activity, or utilization without GPM, under \
         {}% (NvidiaGpuIdleWhileAllocated, <code>--idle-threshold</code>). The marks read this \
         tick's values; the alerts fire after 30 minutes of the same. A failed GPU gets neither.</p>\n\
         <p>Refreshes itself every {} s; without JavaScript, reload the page.</p>\n</footer>\n",
        percent(t.busy_utilization_from),
        percent(t.saturated_sm_active_from),
        t.allocated_memory_above_bytes / GIB,
        percent(t.idle_below),
        REFRESH_MS / 1000
    );
}

/// A threshold in percent, to one decimal at most ("5", "2.5").
fn percent(ratio: f64) -> f64 {
    (ratio * 1000.0).round() / 10.0
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() { "unknown" } else { s }
}

/// Appends `s` escaped for HTML text and attribute values: names come from the driver, a
/// scenario file or the kubelet.
fn escape(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
}
