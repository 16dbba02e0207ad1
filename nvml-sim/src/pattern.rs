//! Time patterns: a value as a pure function of elapsed scenario time.
//!
//! Every load input of a scenario (utilization, memory use, PCIe rates, …) is a `Pattern`. A bare
//! number in TOML is a constant; a table picks a shape with `shape = "…"`.

use serde::Deserialize;

/// A value over time `t` (seconds since the simulated clock started).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Pattern {
    /// `utilization = 0.4`: the same value at every t.
    Constant(f64),
    /// `utilization = { shape = "sine", … }`: a time-varying shape.
    Shape(Shape),
}

/// The time-varying shapes. `period` is in seconds; `phase` shifts the shape later by that many
/// seconds, so several GPUs can run the same shape out of step.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "shape", rename_all = "lowercase", deny_unknown_fields)]
pub enum Shape {
    /// `min + (max-min)·(1+sin(2π(t-phase)/period))/2`: starts at the midpoint, rising.
    Sine {
        min: f64,
        max: f64,
        period: f64,
        #[serde(default)]
        phase: f64,
    },
    /// `high` for the first `duty` fraction of each period, `low` for the rest.
    Square {
        low: f64,
        high: f64,
        period: f64,
        #[serde(default = "half")]
        duty: f64,
        #[serde(default)]
        phase: f64,
    },
    /// Saw tooth: linear from `from` to `to` over each period, then jumps back.
    Ramp {
        from: f64,
        to: f64,
        period: f64,
        #[serde(default)]
        phase: f64,
    },
    /// `values[i]` during the i-th `step` seconds, cycling through the list.
    Steps {
        values: Vec<f64>,
        step: f64,
        #[serde(default)]
        phase: f64,
    },
}

fn half() -> f64 {
    0.5
}

impl Default for Pattern {
    fn default() -> Self {
        Pattern::Constant(0.0)
    }
}

impl Pattern {
    /// The value at time `t`.
    pub fn at(&self, t: f64) -> f64 {
        match self {
            Pattern::Constant(v) => *v,
            Pattern::Shape(shape) => shape.at(t),
        }
    }

    /// Rejects shapes that cannot be evaluated (zero or negative periods, empty step lists).
    pub fn validate(&self) -> Result<(), String> {
        let Pattern::Shape(shape) = self else {
            return Ok(());
        };
        let period = match shape {
            Shape::Sine { period, .. }
            | Shape::Square { period, .. }
            | Shape::Ramp { period, .. } => *period,
            Shape::Steps { values, step, .. } => {
                if values.is_empty() {
                    return Err("steps: `values` is empty".into());
                }
                *step
            }
        };
        if !(period.is_finite() && period > 0.0) {
            return Err(format!("period/step must be > 0, got {period}"));
        }
        if let Shape::Square { duty, .. } = shape {
            if !(0.0..=1.0).contains(duty) {
                return Err(format!("square: duty must be in 0..=1, got {duty}"));
            }
        }
        Ok(())
    }
}

impl Shape {
    fn at(&self, t: f64) -> f64 {
        match self {
            Shape::Sine {
                min,
                max,
                period,
                phase,
            } => {
                let x = std::f64::consts::TAU * (t - phase) / period;
                min + (max - min) * (1.0 + x.sin()) / 2.0
            }
            Shape::Square {
                low,
                high,
                period,
                duty,
                phase,
            } => {
                if (t - phase).rem_euclid(*period) < duty * period {
                    *high
                } else {
                    *low
                }
            }
            Shape::Ramp {
                from,
                to,
                period,
                phase,
            } => from + (to - from) * (t - phase).rem_euclid(*period) / period,
            Shape::Steps {
                values,
                step,
                phase,
            } => {
                let i = ((t - phase) / step).floor().rem_euclid(values.len() as f64) as usize;
                values[i.min(values.len() - 1)]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Pattern {
        #[derive(Deserialize)]
        struct W {
            p: Pattern,
        }
        toml::from_str::<W>(s).unwrap().p
    }

    #[test]
    fn constant_and_shapes() {
        assert_eq!(parse("p = 0.25").at(123.0), 0.25);
        let sine = parse("p = { shape = \"sine\", min = 0.0, max = 1.0, period = 40 }");
        assert!((sine.at(0.0) - 0.5).abs() < 1e-12);
        assert!((sine.at(10.0) - 1.0).abs() < 1e-12);
        assert!((sine.at(30.0) - 0.0).abs() < 1e-12);
        let sq =
            parse("p = { shape = \"square\", low = 0.1, high = 0.9, period = 10, duty = 0.3 }");
        assert_eq!(sq.at(2.9), 0.9);
        assert_eq!(sq.at(3.1), 0.1);
        assert_eq!(sq.at(12.0), 0.9);
        let ramp = parse("p = { shape = \"ramp\", from = 0.0, to = 1.0, period = 100 }");
        assert!((ramp.at(150.0) - 0.5).abs() < 1e-12);
        let steps = parse("p = { shape = \"steps\", values = [1.0, 2.0, 3.0], step = 5 }");
        assert_eq!(steps.at(0.0), 1.0);
        assert_eq!(steps.at(7.0), 2.0);
        assert_eq!(steps.at(16.0), 1.0);
    }

    #[test]
    fn invalid_shapes_are_rejected() {
        assert!(
            parse("p = { shape = \"sine\", min = 0.0, max = 1.0, period = 0 }")
                .validate()
                .is_err()
        );
        assert!(
            parse("p = { shape = \"steps\", values = [], step = 1 }")
                .validate()
                .is_err()
        );
    }
}
