//! The node page (`/`) and `/api/v1/gpus` on the real binary: at one tick, every field they
//! show (`nvml_exporter::page::fields`) equals what `/metrics` serves, the demo's GPUs carry the marks the alert rules define
//! (GPU 1 busy but not saturated, GPU 7 allocated but idle), a MIG GPU shows its instances, and
//! the page for eight GPUs stays small.

mod common;

use std::time::Duration;

use common::{Exporter, Exposition, eventually, scenario};
use nvml_exporter::page::fields::{FIELDS, Shown};
use serde_json::Value;

/// `/metrics`, the JSON and the page, all of one tick: fetched until the tick's timestamp is
/// the same in all three and in a second `/metrics` after them.
fn one_tick(e: &Exporter) -> (Exposition, Value, String) {
    eventually(Duration::from_secs(20), "three answers of one tick", || {
        let before = e.metrics();
        let json: Value = serde_json::from_slice(&e.get("/api/v1/gpus").body).unwrap();
        let page = e.get("/").text();
        let after = e.metrics();
        let tick = before.value("nvml_exporter_last_sample_timestamp_seconds", &[])?;
        let same = json["last_tick_timestamp_seconds"].as_f64() == Some(tick)
            && attribute(&page, "data-tick").parse::<f64>().ok() == Some(tick)
            && after.value("nvml_exporter_last_sample_timestamp_seconds", &[]) == Some(tick);
        same.then_some((before, json, page))
    })
}

/// The value of the first `name="…"` attribute in `html`.
fn attribute<'a>(html: &'a str, name: &str) -> &'a str {
    let start = html
        .find(&format!("{name}=\""))
        .unwrap_or_else(|| panic!("no {name} in {html}"))
        + name.len()
        + 2;
    &html[start..start + html[start..].find('"').unwrap()]
}

/// The page's card of GPU `gpu`, up to the next GPU's card or the legend (MIG instances
/// included).
fn card(page: &str, gpu: u64) -> &str {
    let start = page
        .find(&format!("<article class=\"gpu\" id=\"gpu-{gpu}\""))
        .unwrap_or_else(|| panic!("no card for GPU {gpu}"));
    let rest = &page[start + 1..];
    let end = ["<article class=\"gpu\"", "<footer>"]
        .iter()
        .filter_map(|next| rest.find(next))
        .min()
        .unwrap();
    &page[start..start + 1 + end]
}

/// The raw number the page holds for `field` in `html` (`data-field="…" data-value="…"`).
fn page_value(html: &str, field: &str) -> Option<f64> {
    let at = html.find(&format!("data-field=\"{field}\" data-value=\""))?;
    let value = attribute(&html[at..], "data-value");
    Some(value.parse().unwrap_or_else(|_| panic!("{field}: {value}")))
}

/// The value of a GPU's own series (no `gpu_instance`), or an instance's.
fn served(m: &Exposition, name: &str, gpu: u64, instance: Option<u64>) -> Option<f64> {
    let gpu = gpu.to_string();
    let instance = instance.map(|i| i.to_string());
    let found: Vec<f64> = m
        .find(name, &[("gpu", &gpu)])
        .into_iter()
        .filter(|s| s.labels.get("gpu_instance") == instance.as_ref())
        .map(|s| s.value)
        .collect();
    assert!(found.len() <= 1, "{name} gpu {gpu} {instance:?}: {found:?}");
    found.first().copied()
}

/// Every field of the page (`nvml_exporter::page::fields`) of `view` (a GPU's or an instance's
/// JSON object) equals the series of its family, and the page's `html` for it shows the same:
/// the number in its `data-field`, or the flag's words while it is on.
fn assert_same_numbers(m: &Exposition, view: &Value, html: &str, gpu: u64, instance: Option<u64>) {
    for field in FIELDS {
        let name = field.name;
        let served = served(m, field.family, gpu, instance);
        if let Shown::Flag { text } = field.shown {
            let json = view[name].as_bool();
            assert_eq!(json.map(f64::from), served, "GPU {gpu} {instance:?} {name}");
            assert_eq!(
                html.contains(&format!("▲ {text}")),
                json == Some(true),
                "page: GPU {gpu} {instance:?} {name}"
            );
        } else {
            let json = view[name].as_f64();
            assert_eq!(json, served, "GPU {gpu} {instance:?} {name}");
            assert_eq!(
                page_value(html, name),
                json,
                "page: GPU {gpu} {instance:?} {name}"
            );
        }
    }
}

fn marks(view: &Value) -> Vec<&str> {
    view["marks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect()
}

#[test]
fn the_page_and_its_json_show_what_metrics_serves_at_the_same_tick_with_the_alert_marks() {
    let e = Exporter::start(&[], &["--interval", "500ms"]);
    // GPM values come from the second tick on.
    e.wait_metrics(Duration::from_secs(20), "GPM values", |m| {
        m.gpu_value("nvidia_gpu_sm_active_ratio", 7, &[]).is_some()
    });
    let (m, json, page) = one_tick(&e);

    assert_eq!(json["driver_version"], "550.127.05");
    assert_eq!(json["cuda_driver_version"], "12.4");
    assert_eq!(json["exporter_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(json["nvml_up"], true);
    assert!(
        json["collector_groups"]
            .as_array()
            .unwrap()
            .contains(&"saturation".into())
    );
    for header in [
        "550.127.05",
        "CUDA <b>12.4</b>",
        "href=\"/metrics\"",
        "href=\"/healthz\"",
        "href=\"/readyz\"",
        "href=\"/api/v1/gpus\"",
        "collector groups: core,",
    ] {
        assert!(page.contains(header), "{header} not on the page");
    }
    let gpus = json["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    for (i, gpu) in gpus.iter().enumerate() {
        let index = i as u64;
        assert_eq!(gpu["gpu"], index);
        let html = card(&page, index);
        assert!(html.contains(gpu["uuid"].as_str().unwrap()), "GPU {i} uuid");
        assert!(html.contains("NVIDIA H100 80GB HBM3"), "GPU {i} name");
        assert_eq!(gpu["state"], "up");
        assert_same_numbers(&m, gpu, html, index, None);
        // What a reader sees: the percentages and the power beside the bars.
        let utilization = gpu["utilization"].as_f64().unwrap();
        assert!(
            html.contains(&format!(">{:.0}%<", utilization * 100.0)),
            "GPU {i}"
        );
        let power = gpu["power_watts"].as_f64().unwrap();
        assert!(
            html.contains(&format!(">{power:.0}</span>")),
            "GPU {i} power"
        );
        let state = served(&m, "nvidia_gpu_health_state", index, None).unwrap();
        let health = ["healthy", "degraded", "failed"][state as usize];
        assert_eq!(gpu["health"]["state"], health, "GPU {i}");
        assert!(
            html.contains(&format!("data-field=\"health\" data-value=\"{health}\"")),
            "GPU {i}"
        );
        for reason in gpu["health"]["reasons"].as_array().unwrap() {
            let (r, a) = (
                reason["reason"].as_str().unwrap(),
                reason["action"].as_str().unwrap(),
            );
            let g = i.to_string();
            assert_eq!(
                m.value(
                    "nvidia_gpu_health_reason",
                    &[("gpu", &g), ("reason", r), ("action", a)]
                ),
                Some(1.0)
            );
            assert!(
                html.contains(&format!("data-reason=\"{r}\"")),
                "GPU {i} {r}"
            );
        }
        // The marks: GPU 1 runs kernels all the time on 15 % of its SMs; GPU 7's process holds
        // 20 GiB and runs nothing; GPU 0 is idle but nobody holds it.
        let expected: &[&str] = match i {
            1 => &["busy_not_saturated"],
            7 => &["allocated_idle"],
            _ => &[],
        };
        assert_eq!(marks(gpu), expected, "GPU {i}");
        assert_eq!(attribute(html, "data-marks"), expected.join(" "), "GPU {i}");
        assert_eq!(html.contains("▲ busy, not saturated"), i == 1, "GPU {i}");
        assert_eq!(html.contains("▲ allocated, idle"), i == 7, "GPU {i}");
    }
    assert!(card(&page, 0).contains("not held"));
    assert!(card(&page, 7).contains("held by processes outside any pod"));
    // The page says what the marks mean, with the thresholds.
    assert!(page.contains(
        "kernels ran at least 90% of the time while fewer than 30% of the SMs were active"
    ));
    assert!(page.contains("under 5%"));
    assert!(
        page.len() < 100_000,
        "the page for 8 GPUs is {} bytes",
        page.len()
    );

    let r = e.get("/");
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    let policy = r.header("content-security-policy").unwrap();
    assert!(
        policy.contains("default-src 'none'") && policy.contains("connect-src 'self'"),
        "{policy}"
    );
    let r = e.get("/api/v1/gpus");
    assert_eq!(r.header("content-type"), Some("application/json"));
    let script = e.get("/page.js");
    assert_eq!(script.status, 200);
    assert!(script.text().contains("fetch(location.pathname"));
}

#[test]
fn a_gpu_the_bus_lists_and_nvml_does_not_is_on_the_page_as_metrics_serves_it() {
    let mut devices: Vec<_> = common::sysfs::H100X8
        .iter()
        .map(|a| common::sysfs::h100(a))
        .collect();
    devices.push(common::sysfs::h100("0000:ca:00.0"));
    let sys = common::sysfs::sysfs(&devices);
    let e = Exporter::start(
        &[("NVML_EXPORTER_HOST_SYS", sys.path().to_str().unwrap())],
        &["--interval", "500ms"],
    );
    let (m, json, page) = one_tick(&e);
    assert_eq!(m.value("nvidia_node_gpus_missing", &[]), Some(1.0));
    assert_eq!(json["missing_gpus"][0]["pci_bus_id"], "0000:ca:00.0");
    assert_eq!(json["missing_gpus"].as_array().map(Vec::len), Some(1));
    assert_eq!(json["node_health"]["reasons"][0]["reason"], "gpus_missing");
    assert_eq!(attribute(&page, "data-pci-bus-id"), "0000:ca:00.0");
    assert!(page.contains("<b id=\"gpus-missing\">1</b>"), "{page}");
}

#[test]
fn the_idle_mark_follows_the_idle_threshold() {
    // GPU 1's SM activity is 15 %: under a threshold of 20 % it is allocated (18 GiB) and idle.
    let e = Exporter::start(&[], &["--interval", "500ms", "--idle-threshold", "0.2"]);
    let json = eventually(Duration::from_secs(20), "GPM values in the JSON", || {
        let json: Value = serde_json::from_slice(&e.get("/api/v1/gpus").body).unwrap();
        json["gpus"][1]["sm_active"].is_f64().then_some(json)
    });
    assert_eq!(
        marks(&json["gpus"][1]),
        ["busy_not_saturated", "allocated_idle"]
    );
    assert_eq!(json["thresholds"]["idle_below"], 0.2);
    assert!(e.get("/").text().contains("under 20%"));
}

#[test]
fn a_mig_gpu_shows_each_instance_with_the_values_metrics_serves() {
    let path = scenario("h100-mig");
    let e = Exporter::start(
        &[("NVML_SIM_SCENARIO", path.to_str().unwrap())],
        &["--interval", "500ms"],
    );
    e.wait_metrics(Duration::from_secs(20), "per-instance GPM", |m| {
        m.gpu_value("nvidia_gpu_sm_active_ratio", 0, &[("gpu_instance", "2")])
            .is_some()
    });
    let (m, json, page) = one_tick(&e);
    let gpu = &json["gpus"][0];
    assert_eq!(gpu["mig_mode"], true);
    let html = card(&page, 0);
    assert!(html.contains("MIG mode"));
    // The GPU in MIG mode is judged only through its instances, as the alerts do.
    assert_eq!(gpu["allocated"], false);
    assert_eq!(marks(gpu), Vec::<&str>::new());
    let instances = gpu["mig_instances"].as_array().unwrap();
    let served_instances = m.find("nvidia_gpu_mig_instance_info", &[("gpu", "0")]);
    let mut ids: Vec<&str> = served_instances
        .iter()
        .map(|s| s.labels["gpu_instance"].as_str())
        .collect();
    ids.dedup();
    assert_eq!(instances.len(), ids.len());
    for instance in instances {
        let id = instance["gpu_instance"].as_u64().unwrap();
        let start = html
            .find(&format!("data-gpu-instance=\"{id}\""))
            .unwrap_or_else(|| panic!("no card for instance {id}"));
        let part = &html[start..start + html[start..].find("</article>").unwrap()];
        assert!(part.contains(instance["profile"].as_str().unwrap()));
        assert_same_numbers(&m, instance, part, 0, Some(id));
        let idle = instance["sm_active"].as_f64().is_some_and(|a| a < 0.05)
            && instance["memory_used_bytes"]
                .as_f64()
                .is_some_and(|b| b > 1024.0 * 1024.0 * 1024.0);
        assert_eq!(
            marks(instance),
            if idle { vec!["allocated_idle"] } else { vec![] },
            "instance {id}"
        );
    }
    // GI 9 (1g.10gb) holds 2 GiB and runs nothing.
    let nine = instances.iter().find(|i| i["gpu_instance"] == 9).unwrap();
    assert_eq!(marks(nine), ["allocated_idle"]);
}
