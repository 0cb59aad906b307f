#!/usr/bin/env bash
# Puts Debian's promtool into $1 without installing the prometheus package:
# apt-get download fetches the .deb, dpkg-deb unpacks usr/bin/promtool alone.
# Fails (for the Makefile's fallback) when the package cannot be fetched.
set -euo pipefail
dest=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO=sudo; fi
if ! apt-cache show prometheus >/dev/null 2>&1; then
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
fi
cd "$work"
apt-get download -qq prometheus 2>/dev/null
dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x ./usr/bin/promtool
install -m 0755 usr/bin/promtool "$dest/promtool"
"$dest/promtool" --version >&2
