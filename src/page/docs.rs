//! `docs/node-page.md`, rendered from the page's fields (checked by a test; `UPDATE_DOCS=1
//! cargo test --lib page::` writes it). `scripts/check-page.py` reads its table.

use std::fmt::Write;

use super::fields::{FIELDS, Shown};

/// The whole document.
pub fn render_markdown() -> String {
    let mut md = String::from(
        "# The node page's readings\n\n\
<!-- Generated from src/page/fields.rs: `UPDATE_DOCS=1 cargo test --lib page::`. -->\n\n\
What `/` and `/api/v1/gpus` show of each GPU and MIG instance besides its identity, state,\n\
holders, marks and health ([the node page](../README.md#the-node-page)), one row per reading. Each\n\
is read through the family `/metrics` serves it as: the JSON holds the served value in its base\n\
unit, `null` where `/metrics` serves none (a GPU that is down, a reading a MIG instance does not\n\
have), and the page holds the same raw value in the `data-value` attribute of the element whose\n\
`data-field` is the field's name; a flag is shown as its words instead.\n\n\
| field | served as | on the page |\n|---|---|---|\n",
    );
    for f in FIELDS {
        let shown = match f.shown {
            Shown::Ratio { label } => format!("bar *{label}*, in %"),
            Shown::Bar { label, max, unit } => {
                format!("bar *{label}*, against `{max}`, in {}", unit.symbol())
            }
            Shown::Max => {
                let of = FIELDS
                    .iter()
                    .find(|b| matches!(b.shown, Shown::Bar { max, .. } if max == f.name))
                    .map_or("", |b| b.name);
                format!("the end of the bar of `{of}`")
            }
            Shown::Line { label, unit } => format!("line *{label}*, in {}", unit.symbol()),
            Shown::Flag { text } => {
                format!("flag *▲ {text}* while 1 (`true` or `false` in the JSON)")
            }
        };
        let _ = writeln!(md, "| `{}` | `{}` | {shown} |", f.name, f.family);
    }
    md.push_str(
        "\nA new reading is a row of `FIELDS` in src/page/fields.rs: the JSON, the page, the tests,\n\
`scripts/check-page.py` (which reads the table above) and this document follow from it\n\
(CONTRIBUTING.md, *Add a node-page field*).\n",
    );
    md
}
