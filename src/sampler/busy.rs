//! Busy-time counters: each device's readings integrated over time, reading by reading, in the
//! session that reads it. node_exporter's `node_cpu_seconds_total` is the model: `rate()` of
//! such a counter is the mean over any window, whatever the scrape interval, and a missed scrape
//! loses nothing.
//!
//! A reading describes the time before it. A GPM value is the average over the window since the
//! device's previous GPM sample, taken by its previous read; NVML's utilization is the share of
//! its last sample period (1/6 s to 1 s, by product) in which a kernel ran. So each reading counts
//! for the time since the device's previous reading: `value × dt`. For GPM, whose window is that
//! very time, the sum is exact; for utilization it is exact when the interval is no longer than
//! NVML's sample period, and otherwise takes that period as the interval's sample.
//!
//! Busy time is never invented across a gap: a read that was unanswered, or found the GPU lost
//! or the driver gone, adds nothing and ends the stretch, and so does a reading made more than
//! an interval and a device deadline after the previous one (the device was stale in between).
//! The next reading then starts a new stretch and adds nothing itself.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::sample::{BusySeconds, DeviceSample, GpmMetrics};

/// How readings are integrated.
#[derive(Debug, Clone, Copy)]
pub(super) struct Busy {
    /// The longest time between two readings that is integrated over.
    pub max_gap: Duration,
    /// Below this activity a reading counts as idle.
    pub idle_threshold: f64,
}

/// The busy-time totals of one device and of its MIG GPU instances.
#[derive(Debug, Default)]
pub(super) struct BusyClock {
    /// When the previous reading was made; `None` after a gap.
    last: Option<Instant>,
    totals: BusySeconds,
    /// Each GPU instance of the previous reading, by (GI id, profile): an instance re-created
    /// with another profile starts again from 0.
    instances: BTreeMap<(u32, String), BusySeconds>,
}

impl BusyClock {
    /// Counts a reading made at `at`: each value it has times the time since the previous
    /// reading, when that is at most `busy.max_gap`. Writes the totals into the reading and its
    /// instances.
    pub(super) fn add(&mut self, sample: &mut DeviceSample, at: Instant, busy: Busy) {
        let dt = self
            .last
            .map(|last| at.saturating_duration_since(last))
            .filter(|dt| *dt <= busy.max_gap)
            .map_or(0.0, |dt| dt.as_secs_f64());
        self.last = Some(at);
        let threshold = busy.idle_threshold;
        integrate(
            &mut self.totals,
            sample.utilization,
            sample.gpm.as_ref(),
            dt,
            threshold,
        );
        sample.busy = self.totals;
        let mut previous = std::mem::take(&mut self.instances);
        for instance in &mut sample.mig_instances {
            let key = (instance.gpu_instance, instance.profile.clone());
            // A new instance has no GPM window yet: it starts at 0 from this reading.
            let (mut totals, dt) = previous
                .remove(&key)
                .map_or((BusySeconds::default(), 0.0), |t| (t, dt));
            integrate(&mut totals, None, instance.gpm.as_ref(), dt, threshold);
            instance.busy = totals;
            self.instances.insert(key, totals);
        }
    }

    /// The device was not read (unanswered, lost, driver gone): nothing is added for the time
    /// until its next reading.
    pub(super) fn gap(&mut self) {
        self.last = None;
    }
}

/// Adds each value times `dt` to its total (a value present starts its total at 0), `dt` to the
/// time sampled, and to the idle time when the activity is below `idle_threshold`.
fn integrate(
    totals: &mut BusySeconds,
    utilization: Option<f64>,
    gpm: Option<&GpmMetrics>,
    dt: f64,
    idle_threshold: f64,
) {
    fn add(total: &mut Option<f64>, share: Option<f64>, dt: f64) {
        // A share of time: NaN or outside 0..=1 is clamped, so the counter never goes down.
        if let Some(share) = share {
            let share = if share.is_nan() {
                0.0
            } else {
                share.clamp(0.0, 1.0)
            };
            *total.get_or_insert(0.0) += share * dt;
        }
    }
    add(&mut totals.utilization, utilization, dt);
    let g = |f: fn(&GpmMetrics) -> Option<f64>| gpm.and_then(f);
    add(&mut totals.sm_active, g(|g| g.sm_active), dt);
    add(&mut totals.sm_occupancy, g(|g| g.sm_occupancy), dt);
    add(&mut totals.tensor_active, g(|g| g.tensor_active), dt);
    add(&mut totals.dram_active, g(|g| g.dram_active), dt);
    totals.sampled += dt;
    // SM activity says idle better than utilization (a kernel that runs on one SM is "utilized").
    if g(|g| g.sm_active)
        .or(utilization)
        .is_some_and(|activity| activity < idle_threshold)
    {
        totals.idle += dt;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::MigInstanceSample;

    const BUSY: Busy = Busy {
        max_gap: Duration::from_secs(2),
        idle_threshold: 0.05,
    };

    fn reading(utilization: Option<f64>, sm_active: Option<f64>) -> DeviceSample {
        DeviceSample {
            up: true,
            utilization,
            gpm: sm_active.map(|s| GpmMetrics {
                sm_active: Some(s),
                ..GpmMetrics::default()
            }),
            ..DeviceSample::default()
        }
    }

    /// Adds a reading at `ms` milliseconds after `t0` and returns its totals.
    fn add(clock: &mut BusyClock, t0: Instant, ms: u64, mut s: DeviceSample) -> DeviceSample {
        clock.add(&mut s, t0 + Duration::from_millis(ms), BUSY);
        s
    }

    #[test]
    fn each_reading_counts_for_the_time_since_the_previous_one() {
        let t0 = Instant::now();
        let mut c = BusyClock::default();
        // The first reading has nothing before it: the counters start at 0.
        let s = add(&mut c, t0, 0, reading(Some(1.0), None));
        assert_eq!(s.busy.utilization, Some(0.0));
        assert_eq!(s.busy.sm_active, None, "no GPM window yet: no counter");
        let s = add(&mut c, t0, 1000, reading(Some(0.3), Some(0.5)));
        assert_eq!(s.busy.utilization, Some(0.3));
        assert_eq!(s.busy.sm_active, Some(0.5));
        // Real elapsed time, not the nominal interval: a read 250 ms late counts 1.25 s.
        let s = add(&mut c, t0, 2250, reading(Some(0.4), Some(1.0)));
        assert!((s.busy.utilization.unwrap() - 0.8).abs() < 1e-12);
        assert!((s.busy.sm_active.unwrap() - 1.75).abs() < 1e-12);
        // A reading without a value keeps its total.
        let s = add(&mut c, t0, 3250, reading(None, Some(0.0)));
        assert!((s.busy.utilization.unwrap() - 0.8).abs() < 1e-12);
        assert_eq!(s.busy.sm_occupancy, None, "never read: never served");
    }

    #[test]
    fn nothing_is_added_across_a_gap() {
        let t0 = Instant::now();
        let mut c = BusyClock::default();
        add(&mut c, t0, 0, reading(Some(1.0), Some(1.0)));
        add(&mut c, t0, 1000, reading(Some(1.0), Some(1.0)));
        // Unanswered for 5 s, then read again: the first reading after starts a new stretch.
        c.gap();
        let s = add(&mut c, t0, 6000, reading(Some(1.0), Some(1.0)));
        assert_eq!(
            (s.busy.utilization, s.busy.sm_active),
            (Some(1.0), Some(1.0))
        );
        let s = add(&mut c, t0, 7000, reading(Some(1.0), Some(1.0)));
        assert_eq!(s.busy.utilization, Some(2.0));
        // Stale for longer than an interval and a deadline: the late reading adds nothing.
        let s = add(&mut c, t0, 9500, reading(Some(1.0), Some(1.0)));
        assert_eq!(s.busy.utilization, Some(2.0));
        let s = add(&mut c, t0, 10_500, reading(Some(1.0), Some(1.0)));
        assert_eq!(s.busy.utilization, Some(3.0));
    }

    #[test]
    fn idle_time_is_the_time_activity_was_below_the_threshold() {
        let t0 = Instant::now();
        let mut c = BusyClock::default();
        add(&mut c, t0, 0, reading(Some(0.0), None));
        // Utilization where GPM gave nothing; SM activity where it did, whatever utilization says.
        let s = add(&mut c, t0, 1000, reading(Some(0.01), None));
        assert_eq!((s.busy.sampled, s.busy.idle), (1.0, 1.0));
        let s = add(&mut c, t0, 2000, reading(Some(1.0), Some(0.04)));
        assert_eq!((s.busy.sampled, s.busy.idle), (2.0, 2.0));
        let s = add(&mut c, t0, 3000, reading(Some(0.0), Some(0.05)));
        assert_eq!((s.busy.sampled, s.busy.idle), (3.0, 2.0));
        // Neither reading: not idle, though sampled.
        let s = add(&mut c, t0, 4000, reading(None, None));
        assert_eq!((s.busy.sampled, s.busy.idle), (4.0, 2.0));
    }

    #[test]
    fn shares_outside_zero_to_one_never_make_a_counter_go_down() {
        let t0 = Instant::now();
        let mut c = BusyClock::default();
        add(&mut c, t0, 0, reading(Some(0.5), None));
        let s = add(&mut c, t0, 1000, reading(Some(-0.5), None));
        assert_eq!(s.busy.utilization, Some(0.0));
        let s = add(&mut c, t0, 2000, reading(Some(f64::NAN), None));
        assert_eq!(s.busy.utilization, Some(0.0));
        let s = add(&mut c, t0, 3000, reading(Some(1.5), None));
        assert_eq!(s.busy.utilization, Some(1.0));
    }

    #[test]
    fn each_mig_instance_counts_its_own_gpm_and_a_new_one_starts_at_zero() {
        let instance = |gi: u32, profile: &str, sm: Option<f64>| MigInstanceSample {
            gpu_instance: gi,
            profile: profile.into(),
            gpm: sm.map(|s| GpmMetrics {
                sm_active: Some(s),
                tensor_active: Some(s / 2.0),
                ..GpmMetrics::default()
            }),
            ..MigInstanceSample::default()
        };
        let mig = |instances: Vec<MigInstanceSample>| DeviceSample {
            up: true,
            mig_instances: instances,
            ..DeviceSample::default()
        };
        let t0 = Instant::now();
        let mut c = BusyClock::default();
        add(&mut c, t0, 0, mig(vec![instance(1, "3g.40gb", None)]));
        let s = add(
            &mut c,
            t0,
            1000,
            mig(vec![instance(1, "3g.40gb", Some(0.8))]),
        );
        let busy = s.mig_instances[0].busy;
        assert_eq!((busy.sm_active, busy.tensor_active), (Some(0.8), Some(0.4)));
        assert_eq!(
            (s.busy.utilization, s.busy.sm_active),
            (None, None),
            "the GPU itself read nothing"
        );
        // GI 1 re-created as 1g.10gb, and GI 2 created: both from 0.
        let s = add(
            &mut c,
            t0,
            2000,
            mig(vec![
                instance(1, "1g.10gb", Some(1.0)),
                instance(2, "1g.10gb", Some(1.0)),
            ]),
        );
        assert_eq!(s.mig_instances[0].busy.sm_active, Some(0.0));
        assert_eq!(s.mig_instances[1].busy.sm_active, Some(0.0));
        let s = add(
            &mut c,
            t0,
            3000,
            mig(vec![
                instance(1, "1g.10gb", Some(1.0)),
                instance(2, "1g.10gb", Some(0.5)),
            ]),
        );
        assert_eq!(s.mig_instances[0].busy.sm_active, Some(1.0));
        assert_eq!(s.mig_instances[1].busy.sm_active, Some(0.5));
    }
}
