//! Bounded fuzzing on stable Rust, as CI runs it: every target over its seeds, then over
//! proptest-generated inputs, three parts mutated seeds (bit flips, insertions, deletions,
//! truncation, duplication, interesting integers over length fields) to one part random bytes.
//!
//! `SHOAL_FUZZ_CASES` sets the cases per target (default 4096), `SHOAL_FUZZ_SEED` the generator's
//! seed (a number; default fixed, so that CI runs are reproducible: change it to explore, or
//! `random`). Failures are shrunk and kept in `proptest-regressions/bounded.txt`, and run first
//! on the next run.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use shoal_fuzz::mutate::{mutated, Mutation};
use shoal_fuzz::{seeds, TARGETS};

fn cases() -> u32 {
    std::env::var("SHOAL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096)
}

fn seed() -> RngSeed {
    match std::env::var("SHOAL_FUZZ_SEED").ok().as_deref() {
        Some("random") => RngSeed::Random,
        Some(v) => RngSeed::Fixed(
            v.parse()
                .unwrap_or_else(|_| panic!("SHOAL_FUZZ_SEED={v:?} is not a number")),
        ),
        None => RngSeed::Fixed(0x5_0a1),
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        (at, any::<u8>()).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        (at, any::<u8>()).prop_map(|(at, byte)| Mutation::SetByte { at, byte }),
        (at, prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (at, 1usize..64).prop_map(|(at, len)| Mutation::Remove { at, len }),
        at.prop_map(|at| Mutation::Truncate { at }),
        (at, 1usize..256).prop_map(|(at, len)| Mutation::Duplicate { at, len }),
        (at, any::<usize>()).prop_map(|(at, which)| Mutation::Int32 { at, which }),
        (at, any::<usize>()).prop_map(|(at, which)| Mutation::Int16 { at, which }),
    ]
}

fn input(seeds: Vec<Vec<u8>>) -> BoxedStrategy<Vec<u8>> {
    let random = prop::collection::vec(any::<u8>(), 0..600);
    if seeds.is_empty() {
        return random.boxed();
    }
    let n = seeds.len();
    let damaged = (0..n, prop::collection::vec(mutation(), 1..6))
        .prop_map(move |(i, muts)| mutated(&seeds[i], &muts));
    prop_oneof![1 => random, 3 => damaged].boxed()
}

fn fuzz(name: &str) {
    let Some((_, target)) = TARGETS.iter().find(|(n, _)| *n == name) else {
        panic!("no target {name}");
    };
    let seeds = seeds::for_target(name);
    assert!(!seeds.is_empty(), "target {name} has no seeds");
    for s in &seeds {
        target(s);
    }
    let config = Config {
        cases: cases(),
        // Persisted failures are found by source file, as for proptest! tests.
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::SourceParallel("proptest-regressions"),
        )),
        source_file: Some(file!()),
        rng_seed: seed(),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&input(seeds), |data| {
        target(&data);
        Ok(())
    });
    if let Err(e) = result {
        panic!("fuzz target {name}: {e}");
    }
}

#[test]
fn every_target_has_a_test() {
    let listed: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        listed,
        [
            "frame_stream",
            "header_json",
            "header_binary",
            "records",
            "batch",
            "properties",
            "json_bodies",
            "text_fields",
            "acl_request",
            "acl_config",
        ]
    );
}

#[test]
fn frame_stream() {
    fuzz("frame_stream");
}

#[test]
fn header_json() {
    fuzz("header_json");
}

#[test]
fn header_binary() {
    fuzz("header_binary");
}

#[test]
fn records() {
    fuzz("records");
}

#[test]
fn batch() {
    fuzz("batch");
}

#[test]
fn properties() {
    fuzz("properties");
}

#[test]
fn json_bodies() {
    fuzz("json_bodies");
}

#[test]
fn text_fields() {
    fuzz("text_fields");
}

#[test]
fn acl_request() {
    fuzz("acl_request");
}

#[test]
fn acl_config() {
    fuzz("acl_config");
}
