//! Series line prefixes copied from the previous exposition.
//!
//! A GPU's series are the same from one tick to the next: same family, same labels, a new value.
//! Writing a line from scratch means pushing the name, each label name, escaping each label
//! value, the braces and quotes; copying its `name{…} ` prefix from where the previous
//! exposition has it is one copy. [`Lines`] remembers, for each line written through it, which
//! series it was (family, device position, label values) and where its prefix lies in the text;
//! the next encoding, walking the series in the same order, copies the prefix when the series at
//! that place is the same one and the device's shared label pairs (`gpu`, `uuid`, pod labels)
//! did not change, and writes it from scratch otherwise. When the value is the same too (most
//! are: limits, link states, error counters, clocks at rest), the whole line is copied and the
//! number is not formatted again. The output is byte for byte what writing every line from
//! scratch gives (the unit tests encode changing snapshots both ways).
//!
//! The previous text is the exposition already published (a shared `Bytes`, not a copy), so this
//! costs no second buffer of the body's size: only the entries (32 bytes per series) and the
//! label values. The entries are updated in place, so a steady tick allocates nothing here.

use axum::body::Bytes;

/// Marks the end of each label value in the stored keys: `0xFF` never occurs in UTF-8, so two
/// lists of values are equal exactly when their stored forms are.
const END: u8 = 0xFF;

/// One line written through [`Lines::line`].
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Catalog position of the family.
    family: u32,
    /// Position of the device in serving order.
    device: u32,
    /// Range of the label values in the keys (each followed by [`END`]).
    key: (u32, u32),
    /// Where the line starts in the text, the length of its prefix (`name{…} `) and of the
    /// whole line with its newline.
    line: u32,
    prefix: u32,
    len: u32,
    /// The bits of the value written (equal bits: the same text).
    value: u64,
}

/// The lines of the previous encoding, updated in place by the one being written; see the
/// module doc.
#[derive(Debug, Default)]
pub(super) struct Lines {
    /// Text of the previous exposition, which the entries not yet passed point into.
    source: Bytes,
    /// One entry per line written through [`Lines::line`], in writing order: before `cursor`
    /// this encoding's, from it on the previous one's.
    entries: Vec<Entry>,
    /// Label values of the entries, and of replaced ones until the next compaction.
    keys: Vec<u8>,
    cursor: usize,
    /// Between `begin` and `end`. Still set at `begin` when the last encoding never ended (it
    /// panicked): its entries then point into a text that was never published.
    writing: bool,
}

impl Lines {
    /// Starts an encoding: the lines written by the last one (into `source`, its published
    /// text) become the ones to copy from.
    pub(super) fn begin(&mut self) {
        if self.writing {
            self.entries.clear();
            self.keys.clear();
        }
        self.writing = true;
        self.cursor = 0;
        // A steady tick adds no keys; series that change add theirs at the end. Rewrite the
        // keys once the replaced ones take more room than the live ones.
        let live: usize = self
            .entries
            .iter()
            .map(|e| (e.key.1 - e.key.0) as usize)
            .sum();
        if self.keys.len() > 2 * live + 4096 {
            let mut keys = Vec::with_capacity(2 * live);
            for e in &mut self.entries {
                let k0 = keys.len();
                keys.extend_from_slice(&self.keys[e.key.0 as usize..e.key.1 as usize]);
                e.key = (k0 as u32, keys.len() as u32);
            }
            self.keys = keys;
        }
    }

    /// Ends an encoding whose text is `published`: the next one copies from it. Offsets past
    /// `u32::MAX` are not kept (a body of 4 GiB is not an exposition anyone scrapes).
    pub(super) fn end(&mut self, published: Bytes) {
        self.writing = false;
        self.entries.truncate(self.cursor);
        if u32::try_from(published.len()).is_err() || u32::try_from(self.keys.len()).is_err() {
            self.entries.clear();
            self.keys.clear();
        }
        self.source = published;
    }

    /// Writes the line of one series of family `family` (catalog position) of the device at
    /// position `device`, whose label values are `values`: its prefix copied from the previous
    /// exposition when the series written at this place there was the same and `frame_same`
    /// (the device's shared label pairs are unchanged), else written by `render`; then `value`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn line<'a>(
        &mut self,
        out: &mut Vec<u8>,
        family: u32,
        device: u32,
        frame_same: bool,
        values: impl Iterator<Item = &'a str> + Clone,
        render: impl FnOnce(&mut Vec<u8>),
        value: f64,
    ) {
        let start = out.len();
        let at = self.cursor;
        self.cursor += 1;
        let previous = self.entries.get(at).filter(|e| {
            frame_same
                && e.family == family
                && e.device == device
                && same_values(
                    &self.keys[e.key.0 as usize..e.key.1 as usize],
                    values.clone(),
                )
        });
        let bits = value.to_bits();
        let copy = previous.and_then(|e| {
            let line = e.line as usize;
            let end = line + if e.value == bits { e.len } else { e.prefix } as usize;
            self.source.get(line..end)
        });
        if let Some(copied) = copy {
            out.extend_from_slice(copied);
            let e = &mut self.entries[at];
            // Offsets fit: `end` keeps no entries of a text past u32::MAX.
            e.line = start as u32;
            if e.value == bits {
                return;
            }
        } else {
            render(out);
            let k0 = self.keys.len() as u32;
            for v in values {
                self.keys.extend_from_slice(v.as_bytes());
                self.keys.push(END);
            }
            let entry = Entry {
                family,
                device,
                key: (k0, self.keys.len() as u32),
                line: start as u32,
                prefix: (out.len() - start) as u32,
                // Both set below, with the value.
                len: 0,
                value: 0,
            };
            match self.entries.get_mut(at) {
                Some(e) => *e = entry,
                None => self.entries.push(entry),
            }
        }
        super::text::number(out, value);
        out.push(b'\n');
        let e = &mut self.entries[at];
        e.value = bits;
        e.len = (out.len() - start) as u32;
    }
}

/// Whether `stored` (values each followed by [`END`]) holds exactly `values`.
fn same_values<'a>(mut stored: &[u8], values: impl Iterator<Item = &'a str>) -> bool {
    for v in values {
        let v = v.as_bytes();
        match stored.get(v.len()) {
            Some(&END) if &stored[..v.len()] == v => stored = &stored[v.len() + 1..],
            _ => return false,
        }
    }
    stored.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes one line of family 0, GPU 0 with label value `v`; true when it was copied.
    fn write(lines: &mut Lines, out: &mut Vec<u8>, v: &str) -> bool {
        write_value(lines, out, v, 1.0)
    }

    /// [`write`] with the value `value`.
    fn write_value(lines: &mut Lines, out: &mut Vec<u8>, v: &str, value: f64) -> bool {
        let mut rendered = false;
        let render = |out: &mut Vec<u8>| {
            rendered = true;
            out.extend_from_slice(format!("m{{l=\"{v}\"}} ").as_bytes());
        };
        lines.line(out, 0, 0, true, [v].into_iter(), render, value);
        !rendered
    }

    #[test]
    fn each_value_is_written_as_a_fresh_line_would_be_whether_it_changed_or_not() {
        let mut lines = Lines::default();
        let values = [
            1.0,
            2.5,
            2.5,
            -0.0,
            0.0,
            0.0,
            f64::NAN,
            f64::NAN,
            1e300,
            7.0,
            7.0,
        ];
        for (tick, value) in values.into_iter().enumerate() {
            let mut out = Vec::new();
            lines.begin();
            // Two series, so that a copy from the wrong place would show.
            let copied = write_value(&mut lines, &mut out, "a", value);
            write_value(&mut lines, &mut out, "b", 3.0);
            lines.end(Bytes::from(out.clone()));
            assert_eq!(copied, tick > 0, "tick {tick}");
            let mut fresh = b"m{l=\"a\"} ".to_vec();
            crate::metrics::text::number(&mut fresh, value);
            fresh.extend_from_slice(b"\nm{l=\"b\"} 3\n");
            assert_eq!(
                String::from_utf8(out).unwrap(),
                String::from_utf8(fresh).unwrap(),
                "tick {tick}: {value}"
            );
        }
    }

    #[test]
    fn a_line_is_copied_only_after_a_finished_encoding_with_the_same_series() {
        let mut lines = Lines::default();
        let mut out = Vec::new();
        lines.begin();
        assert!(
            !write(&mut lines, &mut out, "a"),
            "nothing to copy from yet"
        );
        lines.end(Bytes::from(std::mem::take(&mut out)));
        lines.begin();
        assert!(write(&mut lines, &mut out, "a"), "the same series: copied");
        assert_eq!(out, b"m{l=\"a\"} 1\n");
        // This encoding never ends (as if it panicked): nothing it recorded may be used, since
        // its text was never published.
        out.clear();
        lines.begin();
        assert!(!write(&mut lines, &mut out, "a"));
        lines.end(Bytes::from(std::mem::take(&mut out)));
        lines.begin();
        assert!(
            !write(&mut lines, &mut out, "b"),
            "other label values: written anew"
        );
        assert_eq!(out, b"m{l=\"b\"} 1\n");
    }
}
