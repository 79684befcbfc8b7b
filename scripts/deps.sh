#!/usr/bin/env bash
# Installs the Debian packages metro's build, tests and fuzzing need (`--test`: the tests'
# browser too). Idempotent: quiet and fast when everything is present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-dev            # libFuzzer + sanitizer runtimes for `make fuzz`
  libgtest-dev libgmock-dev libbenchmark-dev
  libboost-dev                     # Asio / Beast (header-only)
  nlohmann-json3-dev libpcre2-dev libcli11-dev
  python3 python3-pip python3-venv
  libreadline8                     # line editing in `metro chat` (loaded at run time)
  libzmq5                          # `metro serve --kv-events` (loaded at run time)
  libhnswlib-dev                   # the semantic cache's nearest-neighbour index (header-only)
  libjs-marked libjs-highlight.js  # Markdown and code highlighting, embedded in the web UI
)
# `deps.sh --test`: also what the test suite needs beyond the build: a headless browser
# and its WebDriver for the web UI's test.
if [ "${1:-}" = "--test" ]; then
  PACKAGES+=(chromium chromium-driver)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
