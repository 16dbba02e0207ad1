//! One reading over the samples ([`Trace`]) and the TOML values the scenario is written with.

use nvml_wrapper::error::NvmlError;
use toml::{Table, Value};

/// The calls a GPU does not have: NOT_SUPPORTED, or a library without the function.
pub(crate) fn unsupported(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_)
    )
}

/// An error of the same kind for the trace (NvmlError is not Clone): unsupported or failed.
pub(crate) fn same_kind(e: &NvmlError) -> NvmlError {
    if unsupported(e) {
        NvmlError::NotSupported
    } else {
        NvmlError::Unknown
    }
}

/// One reading over the samples: a value, a gap (the call failed this time), or unsupported.
#[derive(Debug, Default)]
pub(crate) struct Trace {
    pub(crate) values: Vec<Option<u64>>,
    pub(crate) unsupported: bool,
    pub(crate) failures: usize,
}

impl Trace {
    pub(crate) fn push<T: Into<u64>>(&mut self, result: Result<T, NvmlError>) {
        match result {
            Ok(v) => self.values.push(Some(v.into())),
            Err(e) => {
                if unsupported(&e) {
                    self.unsupported = true;
                } else {
                    self.failures += 1;
                }
                self.values.push(None);
            }
        }
    }

    /// The scenario's series: a number when it never changed, else one value per sample. A gap
    /// repeats the value before it (the first known value for leading gaps), which keeps
    /// counters monotonic. `None` when unsupported or never answered.
    pub(crate) fn series(&self) -> Option<Value> {
        if self.unsupported {
            return None;
        }
        let mut last = self.values.iter().flatten().next().copied()?;
        let filled: Vec<u64> = self
            .values
            .iter()
            .map(|v| {
                if let Some(v) = v {
                    last = *v;
                }
                last
            })
            .collect();
        if filled.iter().all(|v| *v == filled[0]) {
            Some(int(filled[0]))
        } else {
            Some(Value::Array(filled.into_iter().map(int).collect()))
        }
    }

    pub(crate) fn min(&self) -> Option<u64> {
        self.values.iter().flatten().min().copied()
    }
}

/// One series per link or fan: supported only when every one of them is.
pub(crate) fn list_series(traces: &[Trace]) -> Option<Value> {
    traces
        .iter()
        .map(Trace::series)
        .collect::<Option<Vec<_>>>()
        .filter(|l| !l.is_empty())
        .map(Value::Array)
}

pub(crate) fn int(v: u64) -> Value {
    Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))
}

pub(crate) fn float(v: f64) -> Value {
    Value::Float(v)
}

pub(crate) fn table(pairs: impl IntoIterator<Item = (&'static str, Value)>) -> Value {
    Value::Table(table_of(pairs))
}

pub(crate) fn table_of(pairs: impl IntoIterator<Item = (&'static str, Value)>) -> Table {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

pub(crate) fn watts(mw: u32) -> Value {
    float(f64::from(mw) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(results: Vec<Result<u64, NvmlError>>) -> Trace {
        let mut t = Trace::default();
        for r in results {
            t.push(r);
        }
        t
    }

    #[test]
    fn gaps_repeat_the_value_before_and_unsupported_is_left_out() {
        let t = trace(vec![
            Err(NvmlError::Timeout),
            Ok(5),
            Err(NvmlError::Unknown),
            Ok(9),
        ]);
        assert_eq!(t.failures, 2);
        let want = Value::Array(vec![int(5), int(5), int(5), int(9)]);
        assert_eq!(t.series(), Some(want));
        assert_eq!(trace(vec![Ok(3), Ok(3)]).series(), Some(int(3)));
        assert_eq!(
            trace(vec![Ok(3), Err(NvmlError::NotSupported)]).series(),
            None
        );
        assert_eq!(trace(vec![Err(NvmlError::Unknown)]).series(), None);
        // One unsupported link makes the whole per-link list unsupported.
        let links = [
            trace(vec![Ok(1)]),
            trace(vec![Err(NvmlError::NotSupported)]),
        ];
        assert_eq!(list_series(&links), None);
        assert_eq!(list_series(&[]), None);
    }
}
