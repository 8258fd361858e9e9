#!/usr/bin/env bash
# Installs Debian's Chromium, which the viewer's browser tests drive headless (tests/viewer/chromium.py),
# on a fresh machine. Idempotent: nothing to do when /usr/bin/chromium exists. Needs root (CI runs as
# root) or passwordless sudo, and apt: the package lists are updated first.
#
#   bash infra/chromium.sh
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "[chromium] no apt-get here: install Chromium at /usr/bin/chromium by hand (the viewer tests need it)" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  if sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "[chromium] not root and no passwordless sudo: run 'apt-get install chromium' as root" >&2
    exit 1
  fi
fi
t0=$(date +%s)
echo "[chromium] installing Debian's chromium (headless browser for the viewer tests)"
$SUDO apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >/dev/null
echo "[chromium] $(/usr/bin/chromium --version 2>/dev/null || echo chromium) in $(( $(date +%s) - t0 )) s"
