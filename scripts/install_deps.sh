#!/usr/bin/env bash
# `make deps`: every scripts/deps/*.sh, each engine venv of scripts/deps/engines.sh as a job
# of its own, DEPS_JOBS jobs at a time (default 4). A venv's build is mostly downloads and
# unpacking, which overlap well even on 2 cores; each script is idempotent and safe beside
# the others (kvobs's editable builds and the system's apt-get take turns).
#
# Each job's output is printed whole when it ends, with its time. A job that fails is named
# (with its log); the others still finish, and the run then exits 1.
# Usage: bash scripts/install_deps.sh [DEPS_JOBS]
set -uo pipefail
if ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 501)); then
    echo "deps: needs bash >= 5.1 (wait -n -p), this is $BASH_VERSION" >&2
    exit 2
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${1:-${DEPS_JOBS:-4}}"
if ! [[ "$JOBS" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: bash scripts/install_deps.sh [JOBS]  (JOBS: how many at a time, default 4)" >&2
    exit 2
fi
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT

# The engine venvs first: the largest builds, so they start before the small ones.
queue=()
while read -r engine; do
    queue+=("scripts/deps/engines.sh $engine")
done < <(bash "$REPO/scripts/deps/engines.sh" --list)
for script in "$REPO"/scripts/deps/*.sh; do
    [[ "$(basename "$script")" == engines.sh ]] || queue+=("scripts/deps/$(basename "$script")")
done

declare -A name_of=() started=()
failed=()
begin=$SECONDS

finish() {  # reap one job; print its log and outcome
    local pid status
    wait -n -p pid
    status=$?
    local job="${name_of[$pid]}"
    local log="$LOGS/$pid.log"
    echo "== $job"
    cat "$log"
    if ((status == 0)); then
        echo "deps: $job ok in $((SECONDS - started[$pid])) s"
    else
        echo "deps: FAILED: $job (exit $status, after $((SECONDS - started[$pid])) s)"
        failed+=("$job")
    fi
    unset "name_of[$pid]"
}

for job in "${queue[@]}"; do
    while ((${#name_of[@]} >= JOBS)); do finish; done
    # shellcheck disable=SC2086  # "script [engine]" is words
    (exec >"$LOGS/$BASHPID.log" 2>&1; cd "$REPO" && exec bash $job) &
    name_of[$!]="$job"
    started[$!]=$SECONDS
done
while ((${#name_of[@]} > 0)); do finish; done

echo "deps: ${#queue[@]} jobs, $JOBS at a time, in $((SECONDS - begin)) s"
if ((${#failed[@]})); then
    printf 'deps: FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
