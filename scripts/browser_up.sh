#!/usr/bin/env bash
# Headless Chromium from Debian's packages, for the tests that render the study report's HTML
# (tests/test_browser.py drives it through Playwright with executable_path=/usr/bin/chromium;
# never `playwright install`, which downloads its own browser). .ci/run calls it before the tests.
# Idempotent: installs the package only when missing, prints the version.
set -euo pipefail
pkgs="chromium fonts-dejavu-core"
if [ "$(dpkg-query -W -f='${db:Status-Status}\n' $pkgs 2>/dev/null | grep -cx installed)" -ne "$(wc -w <<<"$pkgs")" ]; then
  echo "[browser_up] installing: $pkgs"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
fi
echo "[browser_up] $(chromium --version 2>/dev/null || /usr/bin/chromium --version)"
