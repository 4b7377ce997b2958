#!/usr/bin/env bash
# Unpacks CPython 3.13's C headers into $REPO/.tools/python3.13 (include/ only).
#
# The C extension (kernels/) has a branch for Python >= 3.12 (the interpreters of the
# engines' own images), and this machine runs 3.11 alone; tests/kernels/
# test_c_sources_compile.py compiles every C source against these headers too. They come
# from Debian 13's `libpython3.13-dev` and `python3.13-dev` packages, downloaded through a
# private package list (nothing installed, the system's sources untouched). Idempotent.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="$REPO/.tools/python3.13"
if [[ -f "$DEST/include/python3.13/Python.h" && -f "$DEST/include/x86_64-linux-gnu/python3.13/pyconfig.h" ]]; then
    echo "python headers: 3.13 already in $DEST"
    exit 0
fi
# shellcheck source=lib/debian.sh
source "$REPO/scripts/deps/lib/debian.sh"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
trixie_download "$WORK" libpython3.13-dev python3.13-dev
cd "$WORK"
rm -rf "$DEST"
mkdir -p "$DEST"
for deb in ./*.deb; do dpkg-deb -x "$deb" unpacked; done
cp -r unpacked/usr/include "$DEST/include"
echo "python headers: 3.13 ($(ls ./*.deb | head -n1 | sed 's/.*_\(3[^_]*\)_.*/\1/')) unpacked into $DEST"
