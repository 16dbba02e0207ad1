//! [`Samples`]: what a catalog row's reader writes into — label values and values of one family
//! for one device (or for the exporter), before identity labels are added.

/// Series of one family collected by a reader. Readers only say *what* exists; the encoder
/// decides how it is labelled and serialised.
#[derive(Debug, Default)]
pub struct Samples {
    series: Vec<(Vec<String>, f64)>,
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
            let labels = label_values.iter().map(|v| (*v).to_owned()).collect();
            self.series.push((labels, value));
        }
    }

    /// A labelled series, only when there is a reading.
    pub fn labelled_opt(&mut self, label_values: &[&str], value: Option<f64>) {
        if let Some(v) = value {
            self.labelled(label_values, v);
        }
    }

    /// Takes the collected series, leaving `self` empty for the next reader.
    pub(crate) fn take(&mut self) -> Vec<(Vec<String>, f64)> {
        std::mem::take(&mut self.series)
    }
}
