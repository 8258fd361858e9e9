#!/usr/bin/env bash
# Installs the stock OpenCode harness (npm `opencode-ai`, pinned) into a grove-local folder, never
# globally: $GROVE_HOME/tools/opencode-ai-<version>/ (GROVE_HOME defaults to ~/.cache/grove). Idempotent:
# a complete install (the platform binary answers `--version` with the pinned version) is kept.
# Prints the binary's path on its last line. Needs `npm`: installed with apt-get when missing (as root).
#
#   bash infra/opencode.sh                      # install (or find) the pinned version
#   GROVE_OPENCODE_VERSION=1.18.33 bash infra/opencode.sh
#
# harnesses/opencode_install.py calls this (under a file lock) when the binary is missing, so the tests
# and the demo work on a fresh machine: OpenCode is installed on first use (infra/bootstrap.sh does not
# install it); run this once yourself to launch OpenCode by hand.
set -euo pipefail
VERSION="${GROVE_OPENCODE_VERSION:-1.18.33}"
HOME_DIR="${GROVE_HOME:-$HOME/.cache/grove}"
DEST="$HOME_DIR/tools/opencode-ai-$VERSION"
case "$(uname -m)" in
  x86_64) ARCH=x64 ;;
  aarch64|arm64) ARCH=arm64 ;;
  *) echo "[opencode] unsupported machine $(uname -m)" >&2; exit 1 ;;
esac
BIN="$DEST/node_modules/opencode-linux-$ARCH/bin/opencode"
if [ -x "$BIN" ] && [ "$("$BIN" --version 2>/dev/null | tail -1)" = "$VERSION" ]; then
  echo "$BIN"
  exit 0
fi
if ! command -v npm >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "[opencode] npm is missing: installing it (apt-get install -y npm)" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >&2
fi
command -v npm >/dev/null || {
  echo "[opencode] npm is missing and could not be installed here: install npm, then run again" >&2; exit 1; }
TMP="$DEST.partial.$$"
rm -rf "$TMP"
mkdir -p "$TMP"
echo "[opencode] installing opencode-ai@$VERSION into $DEST" >&2
# --ignore-scripts: the package's postinstall only links the platform binary, which we address directly
npm install --prefix "$TMP" --no-save --no-audit --no-fund --ignore-scripts --loglevel=error \
  "opencode-ai@$VERSION" >&2
[ -x "$TMP/node_modules/opencode-linux-$ARCH/bin/opencode" ] || {
  echo "[opencode] the install has no opencode-linux-$ARCH binary" >&2; exit 1; }
rm -rf "$DEST"
mv "$TMP" "$DEST"  # atomic on one file system: a half-done install is never at $DEST
"$BIN" --version >&2
echo "$BIN"
