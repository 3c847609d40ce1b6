#!/usr/bin/env bash
# Checks that the tracked C++ sources follow .clang-format (clang-format
# --dry-run --Werror); with --fix, reformats them in place instead.
# Usage: scripts/format_check.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."

# Files not checked, with the reason. Generated tables and embedded pages are
# written by scripts, not by hand; their layout is the generator's.
skip=(
  src/tokenizer/unicode_tables.cpp  # scripts/gen_unicode_tables.py
  src/report/viz_page_html.inc      # scripts/embed_web.py (the page as a string)
)

mode=(--dry-run --Werror)
if [ "${1:-}" = "--fix" ]; then
  mode=(-i)
elif [ $# -gt 0 ]; then
  echo "usage: $0 [--fix]" >&2
  exit 2
fi

files=()
while IFS= read -r f; do
  for s in "${skip[@]}"; do [ "$f" = "$s" ] && continue 2; done
  files+=("$f")
done < <(git ls-files -- src cli tests bench fuzz | grep -E '\.(cpp|h|hpp|inc|cc)$')

if clang-format "${mode[@]}" "${files[@]}"; then
  [ "${1:-}" = "--fix" ] || echo "format_check: ${#files[@]} files follow .clang-format"
else
  echo "format_check: run scripts/format_check.sh --fix" >&2
  exit 1
fi
