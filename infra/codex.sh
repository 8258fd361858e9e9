#!/usr/bin/env bash
# Installs the stock Codex CLI harness (npm `@openai/codex`, pinned) into a grove-local folder, never
# globally: $GROVE_HOME/tools/openai-codex-<version>/ (GROVE_HOME defaults to ~/.cache/grove). The native
# binary comes from the optional dependency `@openai/codex-linux-<arch>` (an alias of
# `@openai/codex@<version>-linux-<arch>`), so npm fetches everything. Idempotent: a complete install (the
# platform binary answers `--version` with the pinned version) is kept. Atomic: the install is built
# beside the destination and moved in at once. Prints the binary's path on its last line. Needs `npm`:
# installed with apt-get when missing (as root).
#
#   bash infra/codex.sh                       # install (or find) the pinned version
#   GROVE_CODEX_VERSION=0.171.0 bash infra/codex.sh
#
# harnesses/codex_install.py calls this (under a file lock) when the binary is missing, so the tests and
# runs work on a fresh machine: Codex is installed on first use (infra/bootstrap.sh does not install it);
# run this once yourself to launch Codex by hand.
set -euo pipefail
VERSION="${GROVE_CODEX_VERSION:-0.171.0}"
HOME_DIR="${GROVE_HOME:-$HOME/.cache/grove}"
DEST="$HOME_DIR/tools/openai-codex-$VERSION"
case "$(uname -m)" in
  x86_64) ARCH=x64; TRIPLE=x86_64-unknown-linux-musl ;;
  aarch64|arm64) ARCH=arm64; TRIPLE=aarch64-unknown-linux-musl ;;
  *) echo "[codex] unsupported machine $(uname -m)" >&2; exit 1 ;;
esac
REL="node_modules/@openai/codex-linux-$ARCH/vendor/$TRIPLE/bin/codex"
BIN="$DEST/$REL"
if [ -x "$BIN" ] && [ "$("$BIN" --version 2>/dev/null | tail -1)" = "codex-cli $VERSION" ]; then
  echo "$BIN"
  exit 0
fi
if ! command -v npm >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "[codex] npm is missing: installing it (apt-get install -y npm)" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >&2
fi
command -v npm >/dev/null || {
  echo "[codex] npm is missing and could not be installed here: install npm, then run again" >&2; exit 1; }
TMP="$DEST.partial.$$"
rm -rf "$TMP"
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
echo "[codex] installing @openai/codex@$VERSION into $DEST" >&2
# --ignore-scripts: nothing of the package needs to run at install time; we address the binary directly
npm install --prefix "$TMP" --no-save --no-audit --no-fund --ignore-scripts --loglevel=error \
  "@openai/codex@$VERSION" >&2
[ -x "$TMP/$REL" ] || {
  echo "[codex] the install has no @openai/codex-linux-$ARCH binary at $REL" >&2; exit 1; }
[ "$("$TMP/$REL" --version 2>/dev/null | tail -1)" = "codex-cli $VERSION" ] || {
  echo "[codex] the installed binary does not answer --version with codex-cli $VERSION" >&2; exit 1; }
rm -rf "$DEST"
mv "$TMP" "$DEST"  # atomic on one file system: a half-done install is never at $DEST
"$BIN" --version >&2
echo "$BIN"
