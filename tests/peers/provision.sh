#!/usr/bin/env bash
# Installs the real peers of the interop tests under DIR (`make peers`):
#   DIR/venv       the Python a2a-sdk (requirements.txt)
#   DIR/grpc-web   node_modules for grpc-web/client.cjs (grpc-web/package-lock.json)
#   DIR/acp        node_modules for the ACP clients of acp/ (acp/package-lock.json)
# Each is installed only when missing or when its pinned requirements changed:
# its stamp file holds the hash of the requirements it was installed from. Runs
# that share DIR (a shared CARGO_TARGET_DIR) take turns on a lock.
#
# Usage: provision.sh DIR
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${1:?usage: provision.sh DIR}"
python="${PYTHON:-python3}"
npm="${NPM:-npm}"

log() { printf '==> peers: %s\n' "$*" >&2; }
die() { printf 'peers: error: %s\n' "$*" >&2; exit 1; }

# The hash of the files a peer is installed from.
digest() { cat "$@" | sha256sum | cut -c1-16; }

# Whether the stamp of a peer says it was installed from `digest`.
installed() { [[ -f "$1" && "$(cat "$1")" == "$2" ]]; }

provision_python() {
    local requirements="$here/requirements.txt" venv="$dir/venv" stamp="$dir/venv.stamp" want
    want="$(digest "$requirements")"
    installed "$stamp" "$want" && return
    "$python" -c 'import ensurepip, venv' 2>/dev/null \
        || die "$python cannot make virtual environments (Debian: apt-get install python3-venv)"
    log "installing the a2a-sdk venv in $venv"
    rm -rf "$venv" "$stamp"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$requirements"
    echo "$want" >"$stamp"
}

# provision_node NAME [NPM ARGS...]: node_modules for NAME/ (its package-lock.json) in
# DIR/NAME, installed with `npm ci` unless other npm arguments are given.
provision_node() {
    local name="$1"
    local install=("${@:2}")
    ((${#install[@]})) || install=(ci)
    local source="$here/$name" target="$dir/$name" stamp="$dir/$name.stamp" want
    want="$(digest "$source/package.json" "$source/package-lock.json")"
    installed "$stamp" "$want" && return
    command -v node >/dev/null 2>&1 || die "node is not installed (Debian: apt-get install nodejs)"
    command -v "$npm" >/dev/null 2>&1 || die "$npm is not installed (Debian: apt-get install npm)"
    log "installing the $name client's packages in $target"
    rm -rf "$target" "$stamp"
    mkdir -p "$target"
    cp "$source/package.json" "$source/package-lock.json" "$target/"
    (cd "$target" && "$npm" "${install[@]}" --no-audit --no-fund --loglevel=error)
    echo "$want" >"$stamp"
}

mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
provision_python
provision_node grpc-web
# `npm ci` refuses acp/'s lock: acpx depends on @openclaw/fs-safe, whose optional
# per-platform packages for macOS and Windows the reachable registry does not have, so
# the lock holds only the Linux ones. `npm install --no-save` installs exactly the
# locked versions and skips what this platform does not need.
provision_node acp install --no-save
