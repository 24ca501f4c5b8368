//! Fuzz targets over everything Shoal decodes from the network or from disk: remoting frames as
//! a byte stream, JSON and ROCKETMQ headers, typed headers and JSON bodies, stored message
//! records (pull answers), batch bodies, message properties, text fields, and ACL (request
//! parsing, signatures, address patterns, ACL files).
//!
//! Each target in [`targets`] takes arbitrary bytes and checks properties, not only the absence
//! of panics: a decoded command encodes and decodes back to itself, a decoded record re-encodes
//! to the same message, decoded properties survive an encode, an unsigned or tampered request is
//! never let through by the ACL while a correctly signed one is, and so on. A violated property
//! panics, which both drivers report with the input:
//!
//! - stable Rust, bounded (CI): `cargo test -p shoal-fuzz` runs every target over its seeds
//!   ([`seeds`]) and over random and mutated inputs ([`mutate`]) with proptest
//!   (`SHOAL_FUZZ_CASES` cases per target, default 4096; failures shrink and are kept in
//!   `proptest-regressions/`);
//! - nightly Rust, coverage-guided: `cargo +nightly fuzz run <target>` in the repository's
//!   `fuzz/` directory (cargo-fuzz / libFuzzer), one fuzz target per function here.

pub mod mutate;
pub mod seeds;
pub mod targets;

/// A fuzz target: takes any bytes, panics only when a property is violated.
pub type Target = fn(&[u8]);

/// Every target with its name (the cargo-fuzz target name), for drivers that run them all.
pub const TARGETS: &[(&str, Target)] = &[
    ("frame_stream", targets::frame_stream),
    ("header_json", targets::header_json),
    ("header_binary", targets::header_binary),
    ("records", targets::records),
    ("batch", targets::batch),
    ("properties", targets::properties),
    ("json_bodies", targets::json_bodies),
    ("text_fields", targets::text_fields),
    ("acl_request", targets::acl_request),
    ("acl_config", targets::acl_config),
];
