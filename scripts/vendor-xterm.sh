#!/bin/sh
# The web UI's terminal view is xterm.js with its fit addon (design/terminal.md). Their built
# scripts, the stylesheet and the licenses are taken from npm at the versions pinned here,
# checked against the integrity pinned here, and put in the gateway's static folder, which
# serves them: the page loads nothing from elsewhere, so it works offline, and nothing runs
# Node after this. Installs npm (Debian's) when missing and we may (root with apt-get);
# otherwise says why not (the page then shows terminal sessions without their terminal view).
set -eu
XTERM=6.0.0
XTERM_INTEGRITY=sha512-TQwDdQGtwwDt+2cgKDLn0IRaSxYu1tSUjgKarSDkUM0ZNiSRXFpjxEsvc/Zgc5kq5omJ+V0a8/kIM2WD3sMOYg==
FIT=0.11.0
FIT_INTEGRITY=sha512-jYcgT6xtVYhnhgxh3QgYDnnNMYTcf8ElbxxFzX0IZo+vabQqSPAjC3c1wJrKB5E19VwQei89QCiZZP86DCPF7g==
DEST="$(cd "$(dirname "$0")/.." && pwd)/supervisor/gateway/static/xterm"
PINNED="@xterm/xterm@$XTERM @xterm/addon-fit@$FIT"
if [ -f "$DEST/VERSION" ] && [ "$(cat "$DEST/VERSION")" = "$PINNED" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing Debian's npm to fetch xterm.js for the web UI..."
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
    else
        echo "npm is not installed and cannot be installed here (needs root and apt-get):"
        echo "the web UI shows terminal sessions without their terminal view."
        exit 0
    fi
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# fetch NAME@VERSION INTEGRITY: the package unpacked in $work/NAME (npm checks the tarball
# against the registry's integrity; we check the registry's against ours).
fetch() {
    mkdir -p "$work/$1"
    got="$(cd "$work/$1" && npm pack --silent --json "$2" \
        | sed -n 's/.*"integrity": *"\([^"]*\)".*/\1/p')"
    if [ "$got" != "$3" ]; then
        echo "$2 is not the package pinned in $0 (integrity $got)" >&2
        exit 1
    fi
    tar xzf "$work/$1"/*.tgz -C "$work/$1"
}

echo "fetching $PINNED for the web UI's terminal view..."
fetch xterm "@xterm/xterm@$XTERM" "$XTERM_INTEGRITY"
fetch fit "@xterm/addon-fit@$FIT" "$FIT_INTEGRITY"
rm -rf "$DEST"
mkdir -p "$DEST"
# The scripts without their source-map comments: the maps are not shipped.
sed '/^\/\/# sourceMappingURL=/d' "$work/xterm/package/lib/xterm.js" >"$DEST/xterm.js"
sed '/^\/\/# sourceMappingURL=/d' "$work/fit/package/lib/addon-fit.js" >"$DEST/addon-fit.js"
cp "$work/xterm/package/css/xterm.css" "$DEST/xterm.css"
cp "$work/xterm/package/LICENSE" "$DEST/LICENSE"
cp "$work/fit/package/LICENSE" "$DEST/LICENSE.addon-fit"
echo "$PINNED" >"$DEST/VERSION"
