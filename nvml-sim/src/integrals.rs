//! Counters that integrate a gauge over time: energy (∫ power), violation time (∫ reason active),
//! NVLink bytes (∫ rate), and the GPM activity counters (∫ SM activity, pipe activity, …).
//!
//! The integral is a fixed midpoint sum on a 0.25 s grid, so it is a pure function of t, exactly
//! reproducible, and monotonic (every integrand is ≥ 0). Partial sums are cached every 64 s, and
//! the sum up to the last grid step asked for is kept as a cursor: callers ask at increasing t
//! (every tick, many counters), so a call costs the grid steps since the previous one (about four
//! per second) instead of up to 256 from the last checkpoint. The cursor sums the same terms in
//! the same order as the checkpoints do, so the answer stays bit-identical whatever was asked
//! before.

use crate::activity;
use crate::physics::{
    REASON_GPU_IDLE, REASON_HW_THERMAL, REASON_SW_POWER_CAP, REASON_SW_THERMAL, Sample,
};
use crate::scenario::GpuSpec;
use std::sync::Mutex;

const STEP: f64 = 0.25;
const CHECKPOINT_STEPS: usize = 256;
const N: usize = 8;

/// Accumulated quantities at time t.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Totals {
    /// Energy, J.
    pub energy_j: f64,
    /// Time under the SW power cap, s.
    pub power_s: f64,
    /// Time under SW or HW thermal slowdown, s.
    pub thermal_s: f64,
    /// Time idle (low utilization), s.
    pub low_util_s: f64,
    /// Time with the SM clock below base, s.
    pub below_base_s: f64,
    /// Time below the application clocks (any power or thermal limit), s.
    pub below_app_s: f64,
    /// NVLink bytes sent, all links.
    pub nvlink_tx_bytes: f64,
    /// NVLink bytes received, all links.
    pub nvlink_rx_bytes: f64,
}

fn integrand(gpu: &GpuSpec, t: f64) -> [f64; N] {
    let s = Sample::at(gpu, t);
    let on = |mask: u64| if s.reasons & mask != 0 { 1.0 } else { 0.0 };
    [
        s.power_w,
        on(REASON_SW_POWER_CAP),
        on(REASON_SW_THERMAL | REASON_HW_THERMAL),
        on(REASON_GPU_IDLE),
        if s.sm_mhz < gpu.clocks.sm.base && s.reasons & REASON_GPU_IDLE == 0 {
            1.0
        } else {
            0.0
        },
        on(REASON_SW_POWER_CAP | REASON_SW_THERMAL | REASON_HW_THERMAL),
        s.nvlink_tx,
        s.nvlink_rx,
    ]
}

fn add<const M: usize>(acc: &mut [f64; M], f: [f64; M], dt: f64) {
    for (a, v) in acc.iter_mut().zip(f) {
        *a += v * dt;
    }
}

/// A checkpointed midpoint-sum integral of `M` gauges of one GPU.
#[derive(Debug)]
struct Cache<const M: usize> {
    state: Mutex<Sums<M>>,
}

/// The partial sums a [`Cache`] keeps.
#[derive(Debug)]
struct Sums<const M: usize> {
    /// The sum over the first `i * CHECKPOINT_STEPS` grid steps, at index `i`.
    checkpoints: Vec<[f64; M]>,
    /// The sum over the first `.0` grid steps (the last whole step asked for).
    cursor: (usize, [f64; M]),
}

impl<const M: usize> Default for Cache<M> {
    fn default() -> Self {
        Cache {
            state: Mutex::new(Sums {
                checkpoints: Vec::new(),
                cursor: (0, [0.0; M]),
            }),
        }
    }
}

impl<const M: usize> Cache<M> {
    /// ∫₀ᵗ `integrand`, on the fixed grid (so the result depends on t only, not on call order).
    fn at(&self, t: f64, integrand: impl Fn(f64) -> [f64; M]) -> [f64; M] {
        let t = if t.is_finite() { t.max(0.0) } else { 0.0 };
        let steps = (t / STEP).floor() as usize;
        let k = steps / CHECKPOINT_STEPS;
        let mut sums = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Sums {
            checkpoints: cps,
            cursor,
        } = &mut *sums;
        if cps.is_empty() {
            cps.push([0.0; M]);
        }
        while cps.len() <= k {
            let i = cps.len() - 1;
            let mut next = cps[i];
            for s in i * CHECKPOINT_STEPS..(i + 1) * CHECKPOINT_STEPS {
                add(&mut next, integrand((s as f64 + 0.5) * STEP), STEP);
            }
            cps.push(next);
        }
        // Continue from the cursor when it lies between checkpoint k and t: summing on from it
        // adds the same terms in the same order as summing on from the checkpoint.
        let (from, mut acc) = if (k * CHECKPOINT_STEPS..=steps).contains(&cursor.0) {
            *cursor
        } else {
            (k * CHECKPOINT_STEPS, cps[k])
        };
        for s in from..steps {
            add(&mut acc, integrand((s as f64 + 0.5) * STEP), STEP);
        }
        *cursor = (steps, acc);
        drop(sums);
        add(
            &mut acc,
            integrand((steps as f64 + 0.5) * STEP),
            t - steps as f64 * STEP,
        );
        acc
    }
}

/// The integral caches of one GPU.
#[derive(Debug, Default)]
pub struct Integrals {
    counters: Cache<N>,
    activity: Cache<{ activity::COUNT }>,
    /// One activity cache per MIG GPU instance of the scenario (by position in its list).
    instances: Vec<Cache<{ activity::COUNT }>>,
}

impl Integrals {
    /// The totals of `gpu` from 0 to `t`.
    pub fn at(&self, gpu: &GpuSpec, t: f64) -> Totals {
        let acc = self.counters.at(t, |t| integrand(gpu, t));
        Totals {
            energy_j: acc[0],
            power_s: acc[1],
            thermal_s: acc[2],
            low_util_s: acc[3],
            below_base_s: acc[4],
            below_app_s: acc[5],
            nvlink_tx_bytes: acc[6],
            nvlink_rx_bytes: acc[7],
        }
    }

    /// The GPM activity counters of `gpu` at `t`: ∫₀ᵗ of each gauge of
    /// [`activity::gauges`], indexed by [`activity::Activity`] (ratio·s, or bytes for PCIe).
    pub fn activity_at(&self, gpu: &GpuSpec, t: f64) -> [f64; activity::COUNT] {
        self.activity.at(t, |t| activity::gauges(gpu, t))
    }

    /// The caches for `gpu`, with room for each of its MIG GPU instances.
    pub fn for_gpu(gpu: &GpuSpec) -> Integrals {
        Integrals {
            instances: gpu.mig.instances.iter().map(|_| Cache::default()).collect(),
            ..Integrals::default()
        }
    }

    /// The GPM activity counters of MIG GPU instance `gi_index` of `gpu` at `t`: ∫₀ᵗ of the
    /// instance's own activity inputs (only differences over its lifetime are ever read).
    pub fn instance_activity_at(
        &self,
        gpu: &GpuSpec,
        gi_index: usize,
        t: f64,
    ) -> [f64; activity::COUNT] {
        let gi = &gpu.mig.instances[gi_index];
        let decoder = gi.profile().decoders > 0;
        self.instances[gi_index].at(t, |t| activity::load_gauges(&gi.activity, decoder, t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{DEFAULT_SCENARIO, Scenario};

    #[test]
    fn counters_are_monotonic_and_energy_matches_power() {
        let scenario = Scenario::parse(DEFAULT_SCENARIO).unwrap();
        for gpu in &scenario.gpus {
            let cache = Integrals::default();
            let mut last = Totals::default();
            let mut t = 0.0;
            while t < 400.0 {
                let now = cache.at(gpu, t);
                for (a, b) in [
                    (last.energy_j, now.energy_j),
                    (last.power_s, now.power_s),
                    (last.thermal_s, now.thermal_s),
                    (last.low_util_s, now.low_util_s),
                    (last.nvlink_tx_bytes, now.nvlink_tx_bytes),
                ] {
                    assert!(b >= a, "{}: counter went back at t={t}", gpu.uuid);
                }
                last = now;
                t += 0.37;
            }
            // A fresh cache (no checkpoints) gives the same answer as a warm one.
            assert_eq!(Integrals::default().at(gpu, 399.0), cache.at(gpu, 399.0));
        }
    }

    #[test]
    fn the_answer_does_not_depend_on_what_was_asked_before() {
        let scenario = Scenario::parse(DEFAULT_SCENARIO).unwrap();
        let gpu = &scenario.gpus[2];
        let warm = Integrals::default();
        // Forward in small steps (the cursor), back within a block and across blocks, a jump
        // past several checkpoints, the same t twice.
        for t in [
            0.1, 0.3, 1.0, 63.9, 64.0, 64.2, 10.0, 130.7, 129.0, 400.3, 400.3, 64.1, 0.0,
        ] {
            assert_eq!(
                warm.at(gpu, t),
                Integrals::default().at(gpu, t),
                "t={t}: a warm cache must answer bit for bit what a fresh one does"
            );
            assert_eq!(
                warm.activity_at(gpu, t),
                Integrals::default().activity_at(gpu, t),
                "t={t}"
            );
        }
    }

    #[test]
    fn energy_integrates_a_sine_load() {
        let gpu = Scenario::parse(
            "[[gpu]]\nmodel = \"L4\"\nuuid = \"GPU-1\"\npci_bus_id = \"01:00.0\"\nserial = \"1\"\n\
             load = { utilization = { shape = \"sine\", min = 0.0, max = 1.0, period = 100 } }",
        )
        .unwrap()
        .gpus
        .remove(0);
        // Over whole periods the sine averages 0.5: mean power = idle + 0.5·(72 − idle).
        let e = Integrals::default().at(&gpu, 1000.0).energy_j;
        let expected = 1000.0 * (16.0 + 0.5 * (72.0 - 16.0));
        assert!((e - expected).abs() / expected < 1e-3, "{e} vs {expected}");
    }

    #[test]
    fn activity_counters_average_to_the_pattern_mean() {
        use crate::activity::Activity;
        let gpu = Scenario::parse(
            "[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"GPU-1\"\npci_bus_id = \"01:00.0\"\n\
             serial = \"1\"\nload = { utilization = 1.0, \
             sm_active = { shape = \"square\", low = 0.2, high = 0.6, period = 10 } }",
        )
        .unwrap()
        .gpus
        .remove(0);
        let cache = Integrals::default();
        let sm = |t: f64| cache.activity_at(&gpu, t)[Activity::Sm as usize];
        // Inside the high half of a period the window average is the high value exactly…
        assert!(((sm(21.0) - sm(20.5)) / 0.5 - 0.6).abs() < 1e-12);
        // …and over whole periods it is the mean of the two levels.
        assert!(((sm(130.0) - sm(30.0)) / 100.0 - 0.4).abs() < 1e-12);
        let graphics = cache.activity_at(&gpu, 50.0)[Activity::Graphics as usize];
        assert!((graphics - 50.0).abs() < 1e-9, "{graphics}");
    }
}
