#!/usr/bin/env bash
# Image size (issue 14). Prints BENCH <name> <value> <unit> lines on stdout, notes on stderr.
# Builds the linux/amd64 image as make image does (into a temporary archive: bin/prism-image.tar is left alone):
#   image.bytes           what a node pulls: manifest, config and gzip-compressed layers, as a registry shows it
#   image.unpacked_bytes  the same layers unpacked, as `docker images` shows it
set -euo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
make --no-print-directory image IMAGE_PLATFORMS=linux/amd64 IMAGE_OUT="$tmp/prism-image.tar" >&2
read -r pulled unpacked < <(bin/tools/prism-image size -archive "$tmp/prism-image.tar" -platform linux/amd64)
echo "BENCH image.bytes $pulled bytes"
echo "BENCH image.unpacked_bytes $unpacked bytes"
