#!/usr/bin/env bash
# cargo-fuzz (libFuzzer) for crates/shoal-fuzz/tests/libfuzzer.rs, which runs every target of
# fuzz/ for a bounded time: a nightly toolchain (rustup; cargo-fuzz builds with sanitizer flags),
# cargo-fuzz from crates.io under target/external/cargo-fuzz, and the targets built once
# (optimised, debug assertions, AddressSanitizer) into target/fuzz.
set -euo pipefail
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  if ! rustup toolchain install nightly --profile minimal; then
    echo "cargo-fuzz: no nightly toolchain and none can be installed: libFuzzer runs will fail"
    exit 0
  fi
fi
root=target/external/cargo-fuzz
if [ ! -x "$root/bin/cargo-fuzz" ]; then
  cargo install cargo-fuzz --locked --version 0.13.2 --root "$root"
fi
RUSTUP_TOOLCHAIN=nightly "$root/bin/cargo-fuzz" fuzz build --fuzz-dir fuzz -O -a --target-dir target/fuzz
echo "cargo-fuzz ready: $("$root/bin/cargo-fuzz" --version), $(rustup run nightly rustc --version)"
