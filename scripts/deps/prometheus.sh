#!/usr/bin/env bash
# Installs the Prometheus 2.42 server and promtool binaries into $REPO/.tools/bin.
#
# They come from the Debian package `prometheus` (unpacked, never installed, so no
# service starts). Idempotent: a fast no-op when both binaries already report 2.42.
# Used by tests/dashboards (promtool check/test rules) and tests/e2e (a real server).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$REPO/.tools/bin"
WANT="2.42."

has_version() {
    [[ -x "$BIN/$1" ]] && "$BIN/$1" --version 2>&1 | head -n1 | grep -q "version $WANT"
}

if has_version prometheus && has_version promtool; then
    echo "prometheus: $("$BIN/prometheus" --version 2>&1 | head -n1) already in $BIN"
    exit 0
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
# `apt-get download` runs unprivileged into the current directory; refresh the package
# lists once only when the cached ones do not know the package.
if ! apt-get download prometheus >/dev/null 2>&1; then
    # shellcheck source=lib/debian.sh
    source "$REPO/scripts/deps/lib/debian.sh"
    system_apt_get update -qq
    apt-get download prometheus
fi
dpkg-deb -x prometheus_*.deb unpacked
mkdir -p "$BIN"
install -m 0755 unpacked/usr/bin/prometheus unpacked/usr/bin/promtool "$BIN/"
has_version prometheus && has_version promtool || {
    echo "prometheus: the Debian package is not $WANT*; pin it or update tests" >&2
    exit 1
}
echo "prometheus: installed $("$BIN/prometheus" --version 2>&1 | head -n1) into $BIN"
