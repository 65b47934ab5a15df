#!/usr/bin/env bash
# Installs Debian's Chromium for the console's browser test (tests/console/test_browser*.py).
# Idempotent: does nothing when /usr/bin/chromium is already there. No browser downloads beyond apt.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y chromium
