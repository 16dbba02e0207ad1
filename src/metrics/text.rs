//! Writing text exposition format 0.0.4 straight into a byte buffer, byte for byte as the
//! `prometheus` crate's `TextEncoder` writes it (the golden file and the unit tests compare the
//! two), without building its `MetricFamily` protobuf values first.
//!
//! Values use Rust's `Display` for `f64`, as that encoder does: integers without a fraction
//! (`250`), no exponent (`85520809984`), shortest round-trip digits (`0.0025`). The encoder
//! never passes a non-finite value here (readers drop them), so `inf`/`NaN` spellings never
//! reach a scrape.
//!
//! Label pairs that every series of a GPU shares are rendered once ([`label_pairs`]) and copied
//! raw into each line ([`sample_framed`]); integral values skip float formatting ([`number`]).
//! The buffer is bytes, not a `String`, so that text already written (those pairs, and whole
//! line prefixes of the previous exposition, see [`super::lines`]) is copied back in without
//! checking again that it is UTF-8; everything written is UTF-8 (`&str` pieces and ASCII).

use std::io::Write;

/// `# HELP` (when there is help text) and `# TYPE` lines of a family.
pub(crate) fn header(out: &mut Vec<u8>, name: &str, help: &str, kind: &str) {
    if !help.is_empty() {
        out.extend_from_slice(b"# HELP ");
        out.extend_from_slice(name.as_bytes());
        out.push(b' ');
        escape(out, help, false);
        out.push(b'\n');
    }
    out.extend_from_slice(b"# TYPE ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    out.extend_from_slice(kind.as_bytes());
    out.push(b'\n');
}

/// One sample line: `name{l1="v1",…} value`. Labels pair up name by name; no braces when there
/// are none.
pub(crate) fn sample<'a>(
    out: &mut Vec<u8>,
    name: &str,
    label_names: impl Iterator<Item = &'a str>,
    label_values: impl Iterator<Item = &'a str>,
    value: f64,
) {
    sample_framed(out, name, b"", label_names, label_values, b"", value);
}

/// Appends `n1="v1",n2="v2",…` (values escaped, no braces): label pairs that many series share,
/// rendered once and then written raw by [`sample_framed`].
pub(crate) fn label_pairs<'a>(
    out: &mut Vec<u8>,
    label_names: impl Iterator<Item = &'a str>,
    label_values: impl Iterator<Item = &'a str>,
) {
    for (i, (n, v)) in label_names.zip(label_values).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        pair(out, n, v);
    }
}

/// `name="value"`, the value escaped.
fn pair(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"=\"");
    escape(out, value, true);
    out.push(b'"');
}

/// The same line as [`sample`] with labels `head`, then the pairs of `label_names` and
/// `label_values`, then `tail`, where `head` and `tail` are pairs already rendered by
/// [`label_pairs`] (either may be empty). A GPU's `gpu`/`uuid` pairs and its pod labels are
/// the same on every one of its ~200 series, so they are escaped once per tick, not per line.
pub(crate) fn sample_framed<'a>(
    out: &mut Vec<u8>,
    name: &str,
    head: &[u8],
    label_names: impl Iterator<Item = &'a str>,
    label_values: impl Iterator<Item = &'a str>,
    tail: &[u8],
    value: f64,
) {
    prefix_framed(out, name, head, label_names, label_values, tail);
    number(out, value);
    out.push(b'\n');
}

/// The part of a [`sample_framed`] line before the value: `name{…} `. It is the same from tick
/// to tick for the same series ([`super::lines`] copies it).
pub(crate) fn prefix_framed<'a>(
    out: &mut Vec<u8>,
    name: &str,
    head: &[u8],
    label_names: impl Iterator<Item = &'a str>,
    label_values: impl Iterator<Item = &'a str>,
    tail: &[u8],
) {
    out.extend_from_slice(name.as_bytes());
    let mut separator = b'{';
    if !head.is_empty() {
        out.push(separator);
        out.extend_from_slice(head);
        separator = b',';
    }
    for (n, v) in label_names.zip(label_values) {
        out.push(separator);
        pair(out, n, v);
        separator = b',';
    }
    if !tail.is_empty() {
        out.push(separator);
        out.extend_from_slice(tail);
        separator = b',';
    }
    if separator == b',' {
        out.push(b'}');
    }
    out.push(b' ');
}

/// Appends `value` exactly as `Display` writes it (shortest round-trip digits, never an
/// exponent). Most values are integers (counters, bytes, flags): below 2^53 an integral `f64`'s
/// shortest digits are its integer digits, written by `itoa`. Fractions below 2^53 go through
/// `ryu`, several times faster than `Display`, when its digits are certainly the ones `Display`
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

/// Appends `v` with `\` and newline escaped (and `"` too inside label values), as the format
/// requires.
pub(crate) fn escape(out: &mut Vec<u8>, v: &str, in_label: bool) {
    let special = |b: &u8| matches!(b, b'\\' | b'\n') || (in_label && *b == b'"');
    // Nearly every value has nothing to escape: one scan, one copy.
    if !v.as_bytes().iter().any(special) {
        out.extend_from_slice(v.as_bytes());
        return;
    }
    let mut rest = v;
    // The special characters are ASCII, so byte positions are char boundaries.
    while let Some(i) = rest.as_bytes().iter().position(special) {
        out.extend_from_slice(&rest.as_bytes()[..i]);
        out.extend_from_slice(match rest.as_bytes()[i] {
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            _ => b"\\\"",
        });
        rest = &rest[i + 1..];
    }
    out.extend_from_slice(rest.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(out: Vec<u8>) -> String {
        String::from_utf8(out).expect("UTF-8")
    }

    fn escaped(v: &str, in_label: bool) -> String {
        let mut out = Vec::new();
        escape(&mut out, v, in_label);
        text(out)
    }

    #[test]
    fn escaping_matches_the_format() {
        assert_eq!(escaped("plain", true), "plain");
        assert_eq!(escaped("a\\b", false), r"a\\b");
        assert_eq!(escaped("a\nb", false), r"a\nb");
        // Help text keeps quotes as they are; label values escape them.
        assert_eq!(escaped("say \"hi\"", false), "say \"hi\"");
        assert_eq!(escaped("say \"hi\"", true), r#"say \"hi\""#);
        assert_eq!(escaped("\\\n\"", true), r#"\\\n\""#);
        assert_eq!(escaped("°C ü \\", true), r"°C ü \\");
    }

    #[test]
    fn sample_lines() {
        let mut out = Vec::new();
        sample(&mut out, "up", [].into_iter(), [].into_iter(), 1.0);
        sample(
            &mut out,
            "m",
            ["a", "b"].into_iter(),
            ["x\"", "2"].into_iter(),
            0.0025,
        );
        sample(
            &mut out,
            "big",
            [].into_iter(),
            [].into_iter(),
            85_520_809_984.0,
        );
        sample(&mut out, "neg", [].into_iter(), [].into_iter(), -1.5);
        assert_eq!(
            text(out),
            "up 1\nm{a=\"x\\\"\",b=\"2\"} 0.0025\nbig 85520809984\nneg -1.5\n"
        );
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

    #[test]
    fn label_pairs_are_escaped_and_comma_separated() {
        let mut out = Vec::new();
        label_pairs(
            &mut out,
            ["gpu", "uuid"].into_iter(),
            ["0", "GPU-\"a\"\\b\nc"].into_iter(),
        );
        assert_eq!(text(out.clone()), r#"gpu="0",uuid="GPU-\"a\"\\b\nc""#);
        out.clear();
        label_pairs(&mut out, [].into_iter(), [].into_iter());
        assert_eq!(out, b"");
    }

    #[test]
    fn framed_lines_equal_lines_with_every_label_spelled_out() {
        let mut head = Vec::new();
        label_pairs(
            &mut head,
            ["gpu", "uuid"].into_iter(),
            ["3", "GPU-\"x\""].into_iter(),
        );
        let mut tail = Vec::new();
        label_pairs(&mut tail, ["pod"].into_iter(), ["p\n"].into_iter());
        // head, names, values, tail; then every name and value spelled out.
        type Case<'a> = (
            &'a [u8],
            &'a [&'a str],
            &'a [&'a str],
            &'a [u8],
            &'a [&'a str],
            &'a [&'a str],
        );
        let cases: [Case; 5] = [
            (
                &head,
                &["link"],
                &["7"],
                &tail,
                &["gpu", "uuid", "link", "pod"],
                &["3", "GPU-\"x\"", "7", "p\n"],
            ),
            (
                &head,
                &[],
                &[],
                &tail,
                &["gpu", "uuid", "pod"],
                &["3", "GPU-\"x\"", "p\n"],
            ),
            (
                &head,
                &["a", "b"],
                &["1", "2"],
                b"",
                &["gpu", "uuid", "a", "b"],
                &["3", "GPU-\"x\"", "1", "2"],
            ),
            (b"", &["a"], &["1"], &tail, &["a", "pod"], &["1", "p\n"]),
            (b"", &[], &[], b"", &[], &[]),
        ];
        for (head, names, values, tail, all_names, all_values) in cases {
            let mut framed = Vec::new();
            sample_framed(
                &mut framed,
                "m",
                head,
                names.iter().copied(),
                values.iter().copied(),
                tail,
                0.25,
            );
            let mut plain = Vec::new();
            sample(
                &mut plain,
                "m",
                all_names.iter().copied(),
                all_values.iter().copied(),
                0.25,
            );
            assert_eq!(framed, plain);
        }
    }
}
