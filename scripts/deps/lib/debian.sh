# Sourced by scripts/deps/*.sh: download Debian packages through a private package list
# (its own lists, fetched fresh: no `apt-get update` of the system needed), the system's
# apt sources untouched and nothing installed.
#
#   debian_download SUITE DIR PACKAGE...   the .debs of PACKAGE... from SUITE (trixie,
#                                          bookworm) into DIR, from the mirror the system
#                                          already uses
#   trixie_download DIR PACKAGE...         the same from Debian 13 (trixie)
#   system_apt_get ARG...                  the system's apt-get (update, install), one at a
#                                          time: scripts/install_deps.sh runs the deps
#                                          scripts side by side, and apt refuses a second
#                                          run at once

system_apt_get() {
    flock "${TMPDIR:-/tmp}/kvobs-deps-apt.lock" apt-get "$@"
}

trixie_download() {
    debian_download trixie "$@"
}

debian_download() {
    local suite="$1" dir="$2"; shift 2
    [[ "$(dpkg --print-architecture)" == amd64 ]] || { echo "$suite: amd64 only" >&2; return 1; }
    local work uri
    work="$(mktemp -d)"
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$dir"
    uri="$(grep -hoE '^URIs: *[^ ]+/debian$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 | awk '{print $2}')"
    [[ -n "$uri" ]] || uri="$(grep -hoE '^deb +[^ ]+/debian ' /etc/apt/sources.list 2>/dev/null | head -n1 | awk '{print $2}')"
    [[ -n "$uri" ]] || { echo "$suite: no Debian mirror in the apt sources" >&2; rm -rf "$work"; return 1; }
    printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$uri" "$suite" > "$work/private.sources"
    local apt_private=(-o "Dir::Etc::SourceList=$work/private.sources" -o Dir::Etc::SourceParts=/dev/null
                       -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
                       -o APT::Sandbox::User=root)
    apt-get -qq "${apt_private[@]}" update &&
        (cd "$dir" && apt-get -qq "${apt_private[@]}" download "$@")
    local rc=$?
    rm -rf "$work"
    return $rc
}
