#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the viewer's browser tests (tests/view/), from Debian's
# packages. Safe to run again; needs root (CI containers run as root) or sudo.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: the viewer tests need chromium and chromedriver; install them (Debian: apt-get install chromium chromium-driver)" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
chromium --version && chromedriver --version
