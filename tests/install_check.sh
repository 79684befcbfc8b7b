#!/usr/bin/env bash
# `cmake --install BUILD` into a temporary prefix: the installed binary runs, the manual page
# is there and names every command `metro --help` lists, the docs and deployment files are
# in place.
set -euo pipefail
BUILD="$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)"
PREFIX="$(mktemp -d)"
trap 'rm -rf "$PREFIX"' EXIT
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null
fail() { echo "install_check: $*" >&2; exit 1; }
"$PREFIX/bin/metro" --version | grep -q '^metro ' || fail "the installed binary does not run"
MAN="$PREFIX/share/man/man1/metro.1"
[ -f "$MAN" ] || fail "no manual page at $MAN"
grep -q '^\.TH METRO 1' "$MAN" || fail "metro.1 has no .TH header"
for cmd in $("$PREFIX/bin/metro" --help | awk '/^  [a-z]/ {print $1}'); do
  grep -q "^\\\\fB$cmd\\\\fR" "$MAN" || fail "metro.1 does not list '$cmd'"
done
grep -q -- '--served-model-name' "$MAN" || fail "metro.1 lacks metro serve's options"
for f in share/doc/metro/README.md share/doc/metro/server.md share/metro/deploy/Dockerfile \
         share/metro/deploy/k8s/deployment.yaml share/metro/deploy/grafana/metro.json \
         share/metro/web/index.html share/metro/web/app.js; do
  [ -f "$PREFIX/$f" ] || fail "missing $f"
done
echo "install_check: $(find "$PREFIX" -type f | wc -l) files installed under a temporary prefix"
