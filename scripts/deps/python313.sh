#!/usr/bin/env bash
# A runnable CPython 3.13 (the interpreter of vLLM's and SGLang's own images) in
# $REPO/.tools/python3.13-root, and a venv
# with kvobs's pure-Python dependencies and pytest in $REPO/.tools/python3.13-root/venv.
# Prints the command line that runs it. Idempotent: what already works is kept.
#
# Nothing is installed on the system. The interpreter, its stdlib and headers and every
# library it loads (glibc included: Debian 13's binaries need glibc 2.38, Debian 12 has
# 2.36) are Debian 13 .debs, downloaded through a private package list
# (scripts/deps/lib/debian.sh: the system's sources untouched), unpacked with dpkg-deb -x. The
# interpreter is then pointed at the root's own loader and libraries with patchelf (Debian
# 12's package, downloaded the same way and unpacked), so that it, and sys.executable in
# a subprocess, runs directly; without patchelf it still runs as
#   $ROOT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path <root libs> $ROOT/usr/bin/python3.13
# No torch for 3.13 (PyPI's Linux wheel pulls the CUDA packages): tests that import torch
# do not run under it.
#
# Usage:
#   scripts/deps/python313.sh          unpack (if needed), print the interpreter's command line
#   scripts/deps/python313.sh --test [DIR] [PYTEST ARGS...]
#       also copy the working tree (tracked and untracked files, not ignored ones) into
#       DIR (default /tmp/kvobs-py313), build kvobs.kernels._native for 3.13 there with
#       setup.py (build_ext --inplace), and run the C extension's tests under 3.13 (or the
#       tests/... paths among PYTEST ARGS, relative to DIR).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ROOT="$REPO/.tools/python3.13-root"
VENV="$ROOT/venv"
LIBS="$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/lib/x86_64-linux-gnu"
LOADER="$ROOT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
PY="$ROOT/usr/bin/python3.13"
LOADED=("$LOADER" --library-path "$LIBS" "$PY")
CHECK='import ssl, ctypes, decimal, sqlite3, lzma, bz2, zlib, readline, sysconfig, os, sys
assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")), "no headers"'
# the interpreter (statically linked to libpython), its stdlib and headers, and every
# library the interpreter or a stdlib extension module loads (ld.so --list of each is clean)
PACKAGES=(python3.13 python3.13-minimal libpython3.13-minimal libpython3.13-stdlib
          python3.13-dev libpython3.13-dev
          libc6 libgcc-s1 libexpat1 zlib1g libffi8 libssl3t64 libbz2-1.0 liblzma5 libzstd1
          libsqlite3-0 libmpdec4 libncursesw6 libtinfo6 libreadline8t64 libuuid1 libdb5.3t64
          media-types tzdata netbase)
TEST_DEPS=(pip setuptools pytest hypothesis
           "opentelemetry-api>=1.35" "opentelemetry-sdk>=1.35"
           "opentelemetry-exporter-otlp-proto-http>=1.35" "prometheus-client>=0.20"
           "structlog>=24.1" "rich>=13.7" "bcrypt>=4.0" "PyYAML>=6")
say() { echo "python3.13: $*" >&2; }
# pip's "Location ... is ignored" for a configured index that is not on this machine: noise
quiet_pip() { "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }

# shellcheck source=lib/debian.sh
source "$REPO/scripts/deps/lib/debian.sh"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

if ! { [[ -x "$LOADER" && -x "$PY" ]] && "${LOADED[@]}" -c "$CHECK" 2>/dev/null; }; then
    trixie_download "$WORK/debs" "${PACKAGES[@]}"
    rm -rf "$ROOT"
    mkdir -p "$ROOT"
    for deb in "$WORK"/debs/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
    (cd "$WORK/debs" && ls ./*.deb | sed 's|^\./||; s/\.deb$//') > "$ROOT/PACKAGES"
    "${LOADED[@]}" -c "$CHECK" || { say "unpacked into $ROOT, but it does not run"; exit 1; }
    say "$("${LOADED[@]}" -VV) unpacked into $ROOT ($(wc -l < "$ROOT/PACKAGES") packages: $ROOT/PACKAGES)"
fi

# the interpreter on its own loader and libraries (DT_RPATH, not RUNPATH: it also covers
# what the stdlib's and wheels' extension modules load)
if ! "$PY" -c "$CHECK" 2>/dev/null; then
    mkdir -p "$WORK/patchelf"
    debian_download bookworm "$WORK/patchelf" patchelf  # runs on this system's glibc
    (cd "$WORK/patchelf" && dpkg-deb -x patchelf_*.deb .)
    "$WORK/patchelf/usr/bin/patchelf" --set-interpreter "$LOADER" --force-rpath --set-rpath "$LIBS" "$PY"
    "$PY" -c "$CHECK" || { say "patched $PY, but it does not run"; exit 1; }
    say "$PY runs on its own loader (patchelf)"
fi

if ! "$VENV/bin/python" -c 'import pytest, structlog, opentelemetry.sdk, prometheus_client, setuptools' 2>/dev/null; then
    rm -rf "$VENV"
    "$PY" -m venv --without-pip "$VENV"  # Debian's ensurepip is a separate package
    # pip itself, as a wheel run as a zipapp (fetched by the project's venv: `make deps`
    # runs after `make setup`; a system python3 may have no pip)
    fetcher="$REPO/.venv/bin/python"
    [[ -x "$fetcher" ]] || fetcher=python3
    quiet_pip "$fetcher" -m pip download -q --no-deps -d "$WORK/pip" pip
    quiet_pip "$VENV/bin/python" "$(ls "$WORK"/pip/pip-*.whl | head -n1)/pip" install -q --disable-pip-version-check "${TEST_DEPS[@]}"
    say "venv $VENV: $("$VENV/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | awk 'NR>2{printf "%s %s, ", $1, $2}')"
fi

say "run it with $VENV/bin/python (the venv), or $PY, or:"
printf '%q ' "${LOADED[@]}"
echo

[[ "${1:-}" == --test ]] || exit 0
shift
DIR=/tmp/kvobs-py313
if [[ $# -gt 0 && "$1" != -* && "$1" != tests* ]]; then DIR="$1"; shift; fi
# the working tree as it is (tracked and untracked, not ignored files); kvobs.kernels and
# kvobs.dashboards are the top-level kernels/ and dashboards/ (setup.py's package_dir)
mkdir -p "$DIR"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
    | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -C "$DIR" -xf -
ln -sfn ../kernels "$DIR/kvobs/kernels"
ln -sfn ../dashboards "$DIR/kvobs/dashboards"
mkdir -p "$DIR/.tools"
[[ -d "$REPO/.tools/python3.13" ]] && ln -sfn "$REPO/.tools/python3.13" "$DIR/.tools/python3.13"
rm -f "$DIR"/kernels/_native.cpython-313-*.so
# Debian's pyconfig.h includes <x86_64-linux-gnu/python3.13/pyconfig.h>, found in
# /usr/include on Debian itself: here the root's usr/include (for setup.py and for
# test_c_sources_compile's compile with the running interpreter's headers)
export CPATH="$ROOT/usr/include${CPATH:+:$CPATH}"
(cd "$DIR" && "$VENV/bin/python" setup.py -q build_ext --inplace --build-temp "$DIR/build/temp-313" >/dev/null)
cd "$DIR"
export PYTHONPATH="$DIR"  # subprocesses (scripts/update_readme.py) import kvobs too
"$VENV/bin/python" - <<'EOF'
import sys
from kvobs.kernels._ext import native
assert native.__file__.endswith(".cpython-313-x86_64-linux-gnu.so"), native.__file__
print(f"python {sys.version.split()[0]}: {native.__file__}")
EOF
if ! printf '%s\n' "$@" | grep -q '^tests'; then  # no test path: the C extension's tests
    set -- "$@" tests/core/test_reuse_core.py tests/core/test_reuse.py \
        tests/core/test_thrash.py tests/core/test_residency_core.py tests/core/test_recorder.py \
        tests/kernels/test_pool_walk.py tests/kernels/test_c_sources_compile.py
fi
exec "$VENV/bin/python" -X dev -m pytest -p no:cacheprovider "$@"
