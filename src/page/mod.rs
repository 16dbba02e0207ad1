//! The node page: `/` shows each GPU of this node busy against saturated, its memory, power,
//! temperature, holder and health, and `/api/v1/gpus` gives scripts the same as JSON.
//!
//! [`fields`] declares the readings it shows, once; [`view`] builds one [`NodeView`] from the
//! snapshot the current exposition was encoded from (the page never calls NVML and never encodes
//! `/metrics`); [`html`] renders it on the server, and serde serialises it for the JSON;
//! [`docs`] renders `docs/node-page.md` from the fields. `page.js` (served at `/page.js`) only
//! fetches the page again every few seconds and swaps it in; everything is in the binary,
//! nothing comes from another host.

pub mod docs;
pub mod fields;
pub mod html;
pub mod view;

pub use view::NodeView;

/// The script that refreshes the page, served at `/page.js`.
pub const SCRIPT: &str = include_str!("page.js");

#[cfg(test)]
mod tests;
