#!/usr/bin/env bash
# The README's first command: set up, build, and generate text with the
# built-in model (extra arguments go to minfer).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
if [ $# -eq 0 ]; then set -- -p "And God said" -n 64; fi
exec ./build/minfer "$@"
