pub mod config;
pub mod sample;
