#!/usr/bin/env bash
# Installs every Debian package and Python package the build and tests need.
# Idempotent: safe to run on every CI start. Debian 12 (bookworm).
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config ccache
  libboost1.81-dev            # Beast/Asio (server)
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libyaml-cpp-dev             # serve --config FILE.yaml
  libcurl4-openssl-dev libssl-dev
  libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-pip curl
  systemd                     # systemd-analyze verify (service unit test)
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# Python oracles and clients used by the tests (pinned for reproducibility).
PYREQ="$(dirname "$0")/../tests/requirements.txt"
if [ -f "$PYREQ" ]; then
  python3 -m pip install -q --disable-pip-version-check -r "$PYREQ" 2>/dev/null \
    || python3 -m pip install -q --disable-pip-version-check --break-system-packages -r "$PYREQ"
fi
