# Sourced by scripts/deps/*.sh: download Debian 13 (trixie) packages through a private
# package list, the system's apt sources untouched and nothing installed.
#
#   trixie_download DIR PACKAGE...   the .debs of PACKAGE... into DIR (from the mirror the
#                                    system already uses, its trixie suite)

trixie_download() {
    local dir="$1"; shift
    [[ "$(dpkg --print-architecture)" == amd64 ]] || { echo "trixie: amd64 only" >&2; return 1; }
    local work uri
    work="$(mktemp -d)"
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$dir"
    uri="$(grep -hoE '^URIs: *[^ ]+/debian$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 | awk '{print $2}')"
    [[ -n "$uri" ]] || uri="$(grep -hoE '^deb +[^ ]+/debian ' /etc/apt/sources.list 2>/dev/null | head -n1 | awk '{print $2}')"
    [[ -n "$uri" ]] || { echo "trixie: no Debian mirror in the apt sources" >&2; rm -rf "$work"; return 1; }
    printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$uri" > "$work/trixie.sources"
    local apt_private=(-o "Dir::Etc::SourceList=$work/trixie.sources" -o Dir::Etc::SourceParts=/dev/null
                       -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
                       -o APT::Sandbox::User=root)
    apt-get -qq "${apt_private[@]}" update &&
        (cd "$dir" && apt-get -qq "${apt_private[@]}" download "$@")
    local rc=$?
    rm -rf "$work"
    return $rc
}
