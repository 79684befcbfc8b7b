#!/usr/bin/env bash
# Prints the path of a `promtool` (Prometheus's checker for metrics, rules and rule tests),
# unpacked from Debian's `prometheus` package under DIR without installing it (installing
# would start a Prometheus server as a service).
#   scripts/promtool.sh DIR
set -euo pipefail
DIR="$1"
BIN="$DIR/usr/bin/promtool"
if [ ! -x "$BIN" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  fetch() { (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1); }
  if ! fetch; then
    # A machine whose package lists were never downloaded knows no package to fetch.
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq >/dev/null
    fetch || { echo "promtool: apt-get download prometheus failed" >&2; exit 1; }
  fi
  mkdir -p "$DIR"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$DIR"
fi
echo "$BIN"
