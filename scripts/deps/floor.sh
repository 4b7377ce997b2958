#!/usr/bin/env bash
# .venv-floor: kvobs with every runtime dependency at the lowest version pyproject.toml
# declares (scripts/deps/floor_requirements.py), plus pytest. tests/packaging/
# test_declared_floor.py runs the telemetry suite in it; the main venv, built fresh,
# holds the newest versions, so both ends of each declared range are tested.
# Idempotent: rebuilt only when the floor list (or RECIPE) changes.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$REPO/.venv-floor"
PYTHON="${KVOBS_FLOOR_PYTHON:-python3}"
RECIPE=1

requirements="$("$PYTHON" "$REPO/scripts/deps/floor_requirements.py" "$REPO/pyproject.toml")"
stamp="$({ echo "recipe $RECIPE"; echo "$requirements"; } | sha256sum | cut -d' ' -f1)"
if [[ -f "$VENV/.kvobs-stamp" && "$(cat "$VENV/.kvobs-stamp")" == "$stamp" ]]; then
    echo "floor: .venv-floor is current"
    exit 0
fi
echo "floor: building .venv-floor ($(echo "$requirements" | tr '\n' ' '))"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q $requirements pytest 2> >(grep -v "^WARNING: Location" >&2)
# kvobs's editable install builds its C extension into kernels/: one at a time (the engine
# venvs' builds may run beside this one, scripts/install_deps.sh)
exec {lock}<"$REPO/setup.py"
flock "$lock"
"$VENV/bin/python" -m pip install -q --no-deps -e "$REPO" 2> >(grep -v "^WARNING: Location" >&2)
exec {lock}<&-
"$VENV/bin/python" -c "import kvobs.exporter" >/dev/null
echo "$stamp" >"$VENV/.kvobs-stamp"
echo "floor: .venv-floor ready"
