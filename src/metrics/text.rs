//! The text exposition format 0.0.4, written straight into a byte buffer byte for byte as the
//! `prometheus` crate's `TextEncoder` writes it: a family's `# HELP` and `# TYPE` lines
//! ([`header`]) and one line per series ([`line()`]). The buffer is a [`Text`], which counts the
//! series written, or only counts them ([`Text::counting`]).
//!
//! Values use Rust's `Display` for `f64`, as that encoder does: integers without a fraction
//! (`250`), no exponent (`85520809984`), shortest round-trip digits (`0.0025`). Readers drop
//! non-finite values, so `inf`/`NaN` spellings never reach a scrape. Everything written is UTF-8
//! (`&str` pieces and ASCII).

use std::io::Write;

/// An exposition being written: its bytes and the number of series in them. A counting one
/// keeps no bytes and only counts, so that `--max-series` can choose what to leave out before
/// anything is encoded.
#[derive(Debug, Default)]
pub(crate) struct Text {
    /// The exposition so far (empty when counting).
    pub bytes: Vec<u8>,
    /// Series written (or counted) so far.
    pub series: usize,
    counting: bool,
}

impl Text {
    /// An empty exposition whose buffer starts with room for `capacity` bytes.
    pub(crate) fn with_capacity(capacity: usize) -> Text {
        Text {
            bytes: Vec::with_capacity(capacity),
            ..Text::default()
        }
    }

    /// One that counts the series written to it and keeps nothing.
    pub(crate) fn counting() -> Text {
        Text {
            counting: true,
            ..Text::default()
        }
    }
}

/// `# HELP` (when there is help text) and `# TYPE` lines of a family. Help texts are the static
/// texts of the catalog and hold nothing the format escapes (a test checks every one), so they
/// are copied as they are.
pub(crate) fn header(out: &mut Text, name: &str, help: &'static str, kind: &str) {
    if out.counting {
        return;
    }
    let out = &mut out.bytes;
    if !help.is_empty() {
        out.extend_from_slice(b"# HELP ");
        out.extend_from_slice(name.as_bytes());
        out.push(b' ');
        out.extend_from_slice(help.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"# TYPE ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    out.extend_from_slice(kind.as_bytes());
    out.push(b'\n');
}

/// One sample line: `name{head,n1="v1",n2="v2",…} value`, label values escaped; no braces when
/// there are no labels. `head` holds label pairs rendered by [`pairs`] (a device's `gpu` and
/// `uuid`, the same on each of its series), or is empty. Every series of the exposition is
/// written by this function.
pub(crate) fn line<'n, 'v>(
    out: &mut Text,
    name: &str,
    head: &str,
    labels: impl IntoIterator<Item = (&'n str, &'v str)>,
    value: f64,
) {
    out.series += 1;
    if out.counting {
        return;
    }
    let out = &mut out.bytes;
    out.extend_from_slice(name.as_bytes());
    let mut separator = b'{';
    if !head.is_empty() {
        out.push(separator);
        out.extend_from_slice(head.as_bytes());
        separator = b',';
    }
    for (label, label_value) in labels {
        out.push(separator);
        pair(out, label, label_value);
        separator = b',';
    }
    if separator == b',' {
        out.push(b'}');
    }
    out.push(b' ');
    number(out, value);
    out.push(b'\n');
}

/// Label pairs `n1="v1",n2="v2"` rendered once, for [`line()`]'s `head`.
pub(crate) fn pairs<'n, 'v>(labels: impl IntoIterator<Item = (&'n str, &'v str)>) -> String {
    let mut out = Vec::new();
    for (i, (label, label_value)) in labels.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        pair(&mut out, label, label_value);
    }
    // Names are ASCII and values are `&str`, escaped with ASCII sequences.
    String::from_utf8(out).expect("label pairs are UTF-8")
}

/// `label="value"`, the value escaped.
fn pair(out: &mut Vec<u8>, label: &str, label_value: &str) {
    out.extend_from_slice(label.as_bytes());
    out.extend_from_slice(b"=\"");
    escape(out, label_value);
    out.push(b'"');
}

/// Appends `value` exactly as `Display` writes it (shortest round-trip digits, never an
/// exponent). Most values are integers (counters, bytes, flags): below 2^53 an integral `f64`'s
/// shortest digits are its integer digits, written by `itoa`. Fractions below 2^53 go through
/// `ryu` when its digits are certainly the ones `Display`
/// picks: with at most 15 significant digits only one decimal of that length lies within the
/// value's rounding interval, so both find the same one (with 17, two can be equally close and
/// the two libraries break the tie differently). Everything else (long fractions, exponents,
/// `-0.0`) goes through `Display`. Property tests compare every path with `Display`.
pub(crate) fn number(out: &mut Vec<u8>, value: f64) {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    // `as` saturates (and maps NaN to 0), so the round trip holds only for integral values in
    // range; it avoids `fract()`, a library call on baseline x86-64.
    let n = value as i64;
    if value.abs() < EXACT && n as f64 == value && !(n == 0 && value.is_sign_negative()) {
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        return;
    }
    if value.abs() < EXACT && value != 0.0 {
        let mut buffer = ryu::Buffer::new();
        let digits = buffer.format_finite(value);
        // No more characters than 15 means no more digits; only longer ones are counted.
        let significant = || {
            digits
                .trim_start_matches(['-', '0', '.'])
                .bytes()
                .filter(u8::is_ascii_digit)
                .count()
        };
        if (digits.len() <= 15 || significant() <= 15) && !digits.contains('e') {
            out.extend_from_slice(digits.as_bytes());
            return;
        }
    }
    // Writing to a Vec cannot fail.
    let _ = write!(out, "{value}");
}

/// Appends the label value `v` with `\`, newline and `"` escaped, as the format requires.
pub(crate) fn escape(out: &mut Vec<u8>, v: &str) {
    let special = |b: &u8| matches!(b, b'\\' | b'\n' | b'"');
    let mut rest = v.as_bytes();
    // Nearly every value has nothing to escape: one scan, one copy.
    while let Some(i) = rest.iter().position(special) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(match rest[i] {
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            _ => b"\\\"",
        });
        rest = &rest[i + 1..];
    }
    out.extend_from_slice(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(out: Vec<u8>) -> String {
        String::from_utf8(out).expect("UTF-8")
    }

    fn escaped(v: &str) -> String {
        let mut out = Vec::new();
        escape(&mut out, v);
        text(out)
    }

    #[test]
    fn label_values_are_escaped_as_the_format_says() {
        assert_eq!(escaped("plain"), "plain");
        assert_eq!(escaped("a\\b"), r"a\\b");
        assert_eq!(escaped("a\nb"), r"a\nb");
        assert_eq!(escaped("say \"hi\""), r#"say \"hi\""#);
        assert_eq!(escaped("\\\n\""), r#"\\\n\""#);
        assert_eq!(escaped("°C ü \\"), r"°C ü \\");
    }

    #[test]
    fn a_rendered_head_is_the_same_as_its_pairs_spelled_out() {
        let labels = [("gpu", "3"), ("uuid", "GPU-\"x\"\n")];
        let head = pairs(labels);
        assert_eq!(head, r#"gpu="3",uuid="GPU-\"x\"\n""#);
        for more in [&[][..], &[("link", "7")][..]] {
            let mut with_head = Text::default();
            line(&mut with_head, "m", &head, more.iter().copied(), 0.5);
            let mut spelled_out = Text::default();
            line(
                &mut spelled_out,
                "m",
                "",
                labels.into_iter().chain(more.iter().copied()),
                0.5,
            );
            assert_eq!(text(with_head.bytes), text(spelled_out.bytes));
        }
        assert_eq!(pairs([]), "");
    }

    #[test]
    fn lines_with_and_without_labels() {
        let mut out = Text::default();
        line(&mut out, "up", "", [], 1.0);
        line(&mut out, "m", "", [("a", "x\""), ("b", "2")], 0.0025);
        line(&mut out, "big", "", [], 85_520_809_984.0);
        line(&mut out, "neg", "", [("gpu", "GPU-\"a\"\\b\nc")], -1.5);
        assert_eq!(out.series, 4);
        assert_eq!(
            text(out.bytes),
            "up 1\nm{a=\"x\\\"\",b=\"2\"} 0.0025\nbig 85520809984\n\
             neg{gpu=\"GPU-\\\"a\\\"\\\\b\\nc\"} -1.5\n"
        );
    }

    #[test]
    fn a_counting_text_counts_series_and_keeps_nothing() {
        let mut out = Text::counting();
        header(&mut out, "m", "Help.", "gauge");
        line(&mut out, "m", "", [("a", "x")], 1.0);
        line(&mut out, "m", "", [("a", "y")], 2.0);
        assert_eq!(out.series, 2);
        assert!(out.bytes.is_empty());
    }

    fn number_text(v: f64) -> String {
        let mut out = Vec::new();
        number(&mut out, v);
        text(out)
    }

    #[test]
    fn numbers_are_written_as_display_writes_them() {
        let exact = 9_007_199_254_740_992.0; // 2^53
        for v in [
            0.0,
            -0.0,
            1.0,
            -1.0,
            9.0,
            10.0,
            -10.0,
            250.0,
            85_520_809_984.0,
            exact - 1.0,
            -(exact - 1.0),
            exact,
            exact * 2.0,
            -exact * 4.0,
            1e21,
            1e300,
            0.5,
            -0.0025,
            1e-7,
            1e-5,
            1.5e-5,
            0.1 + 0.2,
            2.5e15 + 0.5,
            1.234e16 + 2.0,
            5e-324,
            123.456,
            f64::MAX,
            f64::MIN_POSITIVE,
            i64::MAX as f64,
            i64::MIN as f64,
        ] {
            assert_eq!(number_text(v), format!("{v}"), "{v:?}");
        }
        assert_eq!(number_text(-0.0), "-0");
        assert_eq!(number_text(-42.0), "-42");
    }

    proptest::proptest! {
        #[test]
        fn any_number_is_written_as_display_writes_it(v: f64) {
            proptest::prop_assert_eq!(number_text(v), format!("{v}"));
        }

        #[test]
        fn any_fraction_is_written_as_display_writes_it(m in -1.0e7f64..1.0e7, e in -12i32..17) {
            let v = m * 10f64.powi(e - 7);
            proptest::prop_assert_eq!(number_text(v), format!("{v}"));
        }

        #[test]
        fn any_integral_number_is_written_as_display_writes_it(i: i64, shift in 0u32..64) {
            let v = (i >> shift) as f64;
            proptest::prop_assert_eq!(number_text(v), format!("{v}"));
        }
    }
}
