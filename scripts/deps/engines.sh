#!/usr/bin/env bash
# Engine venvs for the adapter tests: real vLLM 0.33.0 and LMCache 0.5.6 on CPU.
#
#   .venv-vllm     vLLM 0.33.0 (--no-deps) + scripts/deps/engines/vllm-0.33.0-cpu-extra-requirements.txt
#   .venv-lmcache  LMCache 0.5.6 (--no-deps) + its list (it pins numpy<=2.2.6, hence its own venv)
#
# Each venv also gets torch==2.13.0 (the CPU wheel), kvobs installed editable and pytest.
# Idempotent: a venv whose stamp matches this script and its requirement list is left alone.
# Usage: bash scripts/deps/engines.sh [vllm|lmcache ...]   (default: all engines)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LISTS="$REPO/scripts/deps/engines"
PYTHON="${KVOBS_ENGINE_PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"

declare -A ENGINE_PKG=(
    [vllm]="vllm==0.33.0"
    [lmcache]="lmcache==0.5.6"
)
declare -A ENGINE_LIST=(
    [vllm]="vllm-0.33.0-cpu-extra-requirements.txt"
    [lmcache]="lmcache-0.5.6-cpu-extra-requirements.txt"
)

stamp_of() {  # the content hash that makes an installed venv current
    cat "${BASH_SOURCE[0]}" "$LISTS/${ENGINE_LIST[$1]}" | sha256sum | cut -d' ' -f1
}

install_engine() {
    local engine="$1"
    local venv="$REPO/.venv-$engine"
    local list="$LISTS/${ENGINE_LIST[$engine]}"
    local stamp
    stamp="$(stamp_of "$engine")"
    if [[ -f "$venv/.kvobs-stamp" && "$(cat "$venv/.kvobs-stamp")" == "$stamp" ]]; then
        echo "engines: .venv-$engine is current"
        return 0
    fi
    echo "engines: building .venv-$engine (${ENGINE_PKG[$engine]})"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    local pip=("$venv/bin/python" -m pip install -q)
    "${pip[@]}" "$TORCH_PIN"
    "${pip[@]}" --no-deps "${ENGINE_PKG[$engine]}" -r "$list"
    # kvobs and its small runtime deps; the engine's pins constrain anything they share.
    "${pip[@]}" -c "$list" -e "$REPO" pytest
    "$venv/bin/python" -c "import ${engine}, kvobs" >/dev/null
    echo "$stamp" >"$venv/.kvobs-stamp"
    echo "engines: .venv-$engine ready"
}

engines=("$@")
if [[ ${#engines[@]} -eq 0 ]]; then
    engines=(vllm lmcache)
fi
for engine in "${engines[@]}"; do
    if [[ -z "${ENGINE_PKG[$engine]:-}" ]]; then
        echo "engines: unknown engine '$engine' (known: ${!ENGINE_PKG[*]})" >&2
        exit 2
    fi
    install_engine "$engine"
done
