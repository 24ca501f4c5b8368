#!/usr/bin/env bash
# Headless Debian chromium (apt) and playwright-core (npm, pinned by tests/browser/package-lock.json,
# installed into target/external/browser) for the dashboard's browser test
# (crates/shoal/tests/dashboard_browser.rs). Idempotent: apt runs only for what is missing, npm
# only when the lock file changed. playwright-core 1.61 is the newest release that supports
# Debian bookworm's Node.js 18 as well as newer ones.
set -euo pipefail
cd "$(dirname "$0")/../.."

need=()
[ -x /usr/bin/chromium ] || need+=(chromium fonts-dejavu-core)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    # The downloaded packages are not needed once installed (CI machines can be short of disk).
    apt-get clean
  else
    echo "missing ${need[*]} and cannot install them here (needs root and apt-get):" \
      "the browser test will skip (or fail with SHOAL_REQUIRE_EXTERNAL=1)"
    exit 0
  fi
fi

dir=target/external/browser
if [ ! -f "$dir/node_modules/playwright-core/package.json" ] \
  || ! cmp -s tests/browser/package-lock.json "$dir/package-lock.json"; then
  rm -rf "$dir"
  mkdir -p "$dir"
  cp tests/browser/package.json tests/browser/package-lock.json "$dir/"
  # --ignore-scripts: no browser download; the test drives /usr/bin/chromium.
  (cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
fi
/usr/bin/chromium --version
echo "node $(node --version), playwright-core" \
  "$(node -p "require('./$dir/node_modules/playwright-core/package.json').version") ready in $dir"
