#!/usr/bin/env bash
# Installs every Debian package and Python package the build and tests need.
# Idempotent: safe to run on every CI start. Debian 12 (bookworm).
set -euo pipefail
# --runtime: only what building and running the `moeserve` binary needs (the README's run
# command); without it also the test tools and the Python test oracles, which go into a
# virtual environment (${VENV:-.venv} in the repo root; CTest's Python tests use its python3).
MODE=${1:-all}
PKGS=(
  build-essential cmake ninja-build pkg-config ccache
  libboost1.81-dev            # Beast/Asio (server)
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libyaml-cpp-dev             # serve --config FILE.yaml
  libcurl4-openssl-dev libssl-dev
  libpcre2-dev libutf8proc-dev
  libedit-dev                 # moeserve chat: line editing and history (BSD licence)
  curl
)
if [ "$MODE" != "--runtime" ]; then
  PKGS+=(
    libgtest-dev libgmock-dev libbenchmark-dev
    python3 python3-venv python3-pip
    systemd                   # systemd-analyze verify (service unit test)
    clang libclang-rt-dev     # scripts/fuzz.sh: libFuzzer, ASan and UBSan runtimes
    chromium                  # tests/server/test_web_ui.py: the chat page in headless Chromium
  )
fi
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
[ "$MODE" = "--runtime" ] && exit 0
# Python oracles and clients used by the tests (pinned for reproducibility), in a virtual
# environment: no --break-system-packages.
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV=${VENV:-$ROOT/.venv}
PYREQ="$ROOT/tests/requirements.txt"
[ -x "$VENV/bin/python3" ] || python3 -m venv "$VENV"
"$VENV/bin/python3" -m pip install -q --disable-pip-version-check -r "$PYREQ"
# Oracles installed without their dependencies (xgrammar: no torch; see tests/requirements-nodeps.txt).
PYREQ_NODEPS="$ROOT/tests/requirements-nodeps.txt"
[ -f "$PYREQ_NODEPS" ] && "$VENV/bin/python3" -m pip install -q --disable-pip-version-check --no-deps -r "$PYREQ_NODEPS"
exit 0
