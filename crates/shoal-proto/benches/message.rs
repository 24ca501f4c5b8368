//! Criterion benchmark (being written).
fn main() {}
