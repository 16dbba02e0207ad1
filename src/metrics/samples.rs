//! [`Samples`]: what a catalog row's reader writes into — label values and values of one family
//! for one device (or for the exporter), before identity labels are added.

/// Series of one family collected by a reader. Readers only say *what* exists; the encoder
/// decides how it is labelled and serialised.
///
/// The encoder keeps one `Samples` for its whole life and clears it between readers, so the label
/// values go into one growing string instead of a `String` per label per series: after the first
/// tick, reading a family allocates nothing here.
#[derive(Debug, Default)]
pub struct Samples {
    /// Every label value of every series, back to back.
    values: String,
    /// End offset in `values` of each label value, in push order.
    ends: Vec<usize>,
    /// Per series: the range of `ends` holding its label values, and its value.
    series: Vec<(usize, usize, f64)>,
}

impl Samples {
    /// A series without extra labels.
    pub fn value(&mut self, value: f64) {
        self.labelled(&[], value);
    }

    /// A series without extra labels, only when there is a reading.
    pub fn opt(&mut self, value: Option<f64>) {
        if let Some(v) = value {
            self.value(v);
        }
    }

    /// A 0/1 series.
    pub fn flag(&mut self, on: bool) {
        self.value(if on { 1.0 } else { 0.0 });
    }

    /// A 0/1 series, only when there is a reading.
    pub fn opt_flag(&mut self, on: Option<bool>) {
        if let Some(on) = on {
            self.flag(on);
        }
    }

    /// A series with extra label values, in the row's label order.
    pub fn labelled(&mut self, label_values: &[&str], value: f64) {
        // A non-finite reading is a broken reading, not a measurement: omit it like any other
        // reading the device could not give (the text format would also spell it oddly).
        if value.is_finite() {
            let first = self.ends.len();
            for v in label_values {
                self.values.push_str(v);
                self.ends.push(self.values.len());
            }
            self.series.push((first, self.ends.len(), value));
        }
    }

    /// A labelled series, only when there is a reading.
    pub fn labelled_opt(&mut self, label_values: &[&str], value: Option<f64>) {
        if let Some(v) = value {
            self.labelled(label_values, v);
        }
    }

    /// Forgets every series but keeps the buffers, for the next reader.
    pub(crate) fn clear(&mut self) {
        self.values.clear();
        self.ends.clear();
        self.series.clear();
    }

    /// The collected series in push order: label values (row order) and value.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (impl Iterator<Item = &str> + Clone, f64)> {
        self.series.iter().map(move |&(first, end, value)| {
            let labels = (first..end).map(move |i| {
                let start = if i == 0 { 0 } else { self.ends[i - 1] };
                &self.values[start..self.ends[i]]
            });
            (labels, value)
        })
    }
}
