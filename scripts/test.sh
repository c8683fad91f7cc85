#!/usr/bin/env bash
# README test command: installs dependencies, builds, runs every test (C++ and Python) through CTest.
# Tests labelled `gpu` skip cleanly where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" "$@"
