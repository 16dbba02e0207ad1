//! Series line prefixes copied from the previous exposition.
//!
//! A GPU's series are the same from one tick to the next: same family, same labels, a new value.
//! Writing a line from scratch means pushing the name, each label name, escaping each label
//! value, the braces and quotes; copying its `name{…} ` prefix from where the previous
//! exposition has it is one copy. [`Lines`] remembers, for each line written through it, which
//! series it was (family, device position, label values) and where its prefix lies in the text;
//! the next encoding, walking the series in the same order, copies the prefix when the series at
//! that place is the same one and the device's shared label pairs (`gpu`, `uuid`, pod labels)
//! did not change, and writes it from scratch otherwise. The output is byte for byte what
//! writing every line from scratch gives (the unit tests encode changing snapshots both ways).
//!
//! The previous text is the exposition already published (a shared `Bytes`, not a copy), so this
//! costs no second buffer of the body's size: only the entries (~40 bytes per series) and the
//! label values.

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
    /// Where the line starts in the text, and the length of its prefix (`name{…} `).
    line: u32,
    prefix: u32,
}

/// The lines of the previous encoding and of the one being written; see the module doc.
#[derive(Debug, Default)]
pub(super) struct Lines {
    /// Text of the previous exposition, which `prev` points into.
    source: Bytes,
    prev: Vec<Entry>,
    prev_keys: Vec<u8>,
    next: Vec<Entry>,
    next_keys: Vec<u8>,
    /// Position in `prev` of the entry the next line is compared with.
    cursor: usize,
}

impl Lines {
    /// Starts an encoding: the lines written by the last one (into `source`, its published
    /// text) become the ones to copy from.
    pub(super) fn begin(&mut self) {
        std::mem::swap(&mut self.prev, &mut self.next);
        std::mem::swap(&mut self.prev_keys, &mut self.next_keys);
        self.next.clear();
        self.next_keys.clear();
        self.cursor = 0;
    }

    /// Ends an encoding whose text is `published`: the next one copies from it. Offsets past
    /// `u32::MAX` are not remembered (a body of 4 GiB is not an exposition anyone scrapes).
    pub(super) fn end(&mut self, published: Bytes) {
        if u32::try_from(published.len()).is_err() {
            self.next.clear();
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
        values: impl Iterator<Item = &'a str>,
        render: impl FnOnce(&mut Vec<u8>),
        value: f64,
    ) {
        let start = out.len();
        let key_start = self.next_keys.len();
        for v in values {
            self.next_keys.extend_from_slice(v.as_bytes());
            self.next_keys.push(END);
        }
        let key = &self.next_keys[key_start..];
        let copied = self.prev.get(self.cursor).and_then(|e| {
            let same = frame_same
                && e.family == family
                && e.device == device
                && self.prev_keys.get(e.key.0 as usize..e.key.1 as usize) == Some(key);
            let at = e.line as usize;
            same.then(|| self.source.get(at..at + e.prefix as usize))
                .flatten()
        });
        self.cursor += 1;
        match copied {
            Some(prefix) => out.extend_from_slice(prefix),
            None => render(out),
        }
        let prefix = out.len() - start;
        if let (Ok(line), Ok(prefix), Ok(k0), Ok(k1)) = (
            u32::try_from(start),
            u32::try_from(prefix),
            u32::try_from(key_start),
            u32::try_from(self.next_keys.len()),
        ) {
            self.next.push(Entry {
                family,
                device,
                key: (k0, k1),
                line,
                prefix,
            });
        }
        super::text::number(out, value);
        out.push(b'\n');
    }
}
