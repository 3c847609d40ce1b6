#!/usr/bin/env bash
# Configures and builds minfer (Release) into build/.
set -euo pipefail
cd "$(dirname "$0")/.."
# The "release" preset of CMakePresets.json; MINFER_FATAL_WARNINGS=ON (CI)
# makes warnings errors.
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)"
