#!/usr/bin/env bash
# Headless Debian chromium and playwright-core (tests/browser/package-lock.json) for the
# dashboard's browser test (crates/shoal/tests/dashboard_browser.rs).
set -euo pipefail
if [ ! -x /usr/bin/chromium ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
dir=target/external/browser
if [ ! -f "$dir/node_modules/playwright-core/package.json" ] || ! cmp -s tests/browser/package-lock.json "$dir/package-lock.json"; then
  mkdir -p "$dir"
  cp tests/browser/package.json tests/browser/package-lock.json "$dir/"
  (cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
fi
/usr/bin/chromium --version
echo "playwright-core $(node -p "require('./$dir/node_modules/playwright-core/package.json').version") ready"
