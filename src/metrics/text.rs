//! Writing text exposition format 0.0.4 straight into a `String`, byte for byte as the
//! `prometheus` crate's `TextEncoder` writes it (the golden file and the unit tests compare the
//! two), without building its `MetricFamily` protobuf values first.
//!
//! Values use Rust's `Display` for `f64`, as that encoder does: integers without a fraction
//! (`250`), no exponent (`85520809984`), shortest round-trip digits (`0.0025`). The encoder
//! never passes a non-finite value here (readers drop them), so `inf`/`NaN` spellings never
//! reach a scrape.

use std::fmt::Write;

/// `# HELP` (when there is help text) and `# TYPE` lines of a family.
pub(crate) fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    if !help.is_empty() {
        out.push_str("# HELP ");
        out.push_str(name);
        out.push(' ');
        escape(out, help, false);
        out.push('\n');
    }
    out.push_str("# TYPE ");
    out.push_str(name);
    out.push(' ');
    out.push_str(kind);
    out.push('\n');
}

/// One sample line: `name{l1="v1",…} value`. Labels pair up name by name; no braces when there
/// are none.
pub(crate) fn sample<'a>(
    out: &mut String,
    name: &str,
    label_names: impl Iterator<Item = &'a str>,
    label_values: impl Iterator<Item = &'a str>,
    value: f64,
) {
    out.push_str(name);
    let mut separator = '{';
    for (n, v) in label_names.zip(label_values) {
        out.push(separator);
        out.push_str(n);
        out.push_str("=\"");
        escape(out, v, true);
        out.push('"');
        separator = ',';
    }
    if separator == ',' {
        out.push('}');
    }
    out.push(' ');
    // Writing to a String cannot fail.
    let _ = write!(out, "{value}");
    out.push('\n');
}

/// Appends `v` with `\` and newline escaped (and `"` too inside label values), as the format
/// requires.
pub(crate) fn escape(out: &mut String, v: &str, in_label: bool) {
    let special = |b: &u8| matches!(b, b'\\' | b'\n') || (in_label && *b == b'"');
    let mut rest = v;
    // The special characters are ASCII, so byte positions are char boundaries.
    while let Some(i) = rest.as_bytes().iter().position(special) {
        out.push_str(&rest[..i]);
        out.push_str(match rest.as_bytes()[i] {
            b'\\' => "\\\\",
            b'\n' => "\\n",
            _ => "\\\"",
        });
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(v: &str, in_label: bool) -> String {
        let mut out = String::new();
        escape(&mut out, v, in_label);
        out
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
        let mut out = String::new();
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
            out,
            "up 1\nm{a=\"x\\\"\",b=\"2\"} 0.0025\nbig 85520809984\nneg -1.5\n"
        );
    }
}
