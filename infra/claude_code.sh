#!/usr/bin/env bash
# Installs stock Claude Code (npm `@anthropic-ai/claude-code`, pinned) into a grove-local folder, never
# globally: $GROVE_HOME/tools/claude-code-<version>/ (GROVE_HOME defaults to ~/.cache/grove). Idempotent:
# a complete install (the platform binary answers `--version` with the pinned version) is kept.
# Prints the binary's path on its last line. Needs `npm`: installed with apt-get when missing (as root).
#
#   bash infra/claude_code.sh                         # install (or find) the pinned version
#   GROVE_CLAUDE_CODE_VERSION=2.1.332 bash infra/claude_code.sh
#
# Claude Code is Anthropic's software under its own licence: this script fetches it from the npm registry
# when you run it; grove's repository never contains it. The package is a small wrapper whose optional
# dependency `@anthropic-ai/claude-code-linux-<arch>` holds the native binary, so nothing else is
# downloaded. 2.1.332 declares node>=22; on Node 20 npm only warns (EBADENGINE): the binary does not use
# the machine's Node. harnesses/claude_code_install.py calls this (under a file lock) when the binary is
# missing, so a harness worker installs it on first use (infra/bootstrap.sh does not install it).
set -euo pipefail
VERSION="${GROVE_CLAUDE_CODE_VERSION:-2.1.332}"
HOME_DIR="${GROVE_HOME:-$HOME/.cache/grove}"
DEST="$HOME_DIR/tools/claude-code-$VERSION"
case "$(uname -m)" in
  x86_64) ARCH=x64 ;;
  aarch64|arm64) ARCH=arm64 ;;
  *) echo "[claude-code] unsupported machine $(uname -m)" >&2; exit 1 ;;
esac
BIN="$DEST/node_modules/@anthropic-ai/claude-code-linux-$ARCH/claude"
if [ -x "$BIN" ] && [ "$("$BIN" --version 2>/dev/null | tail -1 | cut -d' ' -f1)" = "$VERSION" ]; then
  echo "$BIN"
  exit 0
fi
if ! command -v npm >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "[claude-code] npm is missing: installing it (apt-get install -y npm)" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >&2
fi
command -v npm >/dev/null || {
  echo "[claude-code] npm is missing and could not be installed here: install npm, then run again" >&2; exit 1; }
TMP="$DEST.partial.$$"
rm -rf "$TMP"
mkdir -p "$TMP"
echo "[claude-code] installing @anthropic-ai/claude-code@$VERSION into $DEST" >&2
# --ignore-scripts: the package's postinstall only copies the platform binary, which we address directly
npm install --prefix "$TMP" --no-save --no-audit --no-fund --ignore-scripts --loglevel=error \
  "@anthropic-ai/claude-code@$VERSION" >&2
[ -x "$TMP/node_modules/@anthropic-ai/claude-code-linux-$ARCH/claude" ] || {
  echo "[claude-code] the install has no @anthropic-ai/claude-code-linux-$ARCH binary (a musl system needs" \
    "the -musl package, which this script does not select)" >&2; exit 1; }
rm -rf "$DEST"
mv "$TMP" "$DEST"  # atomic on one file system: a half-done install is never at $DEST
"$BIN" --version >&2
echo "$BIN"
