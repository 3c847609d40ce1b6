#!/usr/bin/env bash
# Parity with llama.cpp on the shared reference files (../shared/ref), when
# they are present: logits of every shared model, whole prompt in one pass
# and in passes of 64 tokens, checked by compare_logits.py at its default
# bounds; and perplexity of the tiny KJV models within 0.5% of llama.cpp's.
# Each check runs once per kernel level this CPU has (MINFER_CPU: scalar,
# avx2, avx512 on x86-64; neon, dotprod, i8mm on ARM64).
set -euo pipefail
minfer="$1"
shared="$2"
what="${3:-logits}"
py=/usr/bin/python3
. "$(dirname "$0")/parity_perplexity.sh"
# Without ../shared: skipped (exit 77, CTest's SKIP_RETURN_CODE) with the
# reason, or a failure when MINFER_REQUIRE_SHARED=1 (CI has ../shared).
missing() {
  if [ "${MINFER_REQUIRE_SHARED:-}" = 1 ]; then
    echo "parity: FAIL: $1 (MINFER_REQUIRE_SHARED=1)"; exit 1
  fi
  echo "parity: skipped: $1"
  [ "${status:-0}" = 0 ] || exit 1  # what did run failed
  exit 77
}
[ -d "$shared/ref" ] || missing "no reference outputs at $shared/ref"
[ -f "$shared/tools/compare_logits.py" ] || missing "no $shared/tools/compare_logits.py"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
builtin="$(dirname "$0")/../models/kjv-tiny-q8_0.gguf"  # in the repository: always there
levels=0
for level in scalar avx2 avx512 neon dotprod i8mm; do
# minfer refuses a level this CPU lacks (exit 1): skip it
MINFER_CPU=$level "$minfer" info "$builtin" >/dev/null 2>&1 || continue
levels=$((levels + 1))
export MINFER_CPU=$level
echo "== MINFER_CPU=$level"
checked=0
case "$what" in
logits)
  for ref in "$shared"/ref/*/; do
    m=$(basename "$ref")
    if [ ! -f "$shared/models/$m.gguf" ]; then
      echo "parity: no model $shared/models/$m.gguf for reference $ref"
      if [ "${MINFER_REQUIRE_SHARED:-}" = 1 ]; then status=1; fi
      continue
    fi
    checked=$((checked + 1))
    for b in 0 64; do
      printf '%-20s -b %-3s ' "$m" "$b"
      if ! "$minfer" logits -m "$shared/models/$m.gguf" --tokens "$ref/tokens.json" --out "$out/$m-$b" \
          -b "$b" 2>"$out/err"; then
        echo "FAIL: minfer logits failed: $(tail -1 "$out/err")"; status=1; continue
      fi
      $py "$shared/tools/compare_logits.py" "$ref" "$out/$m-$b" || status=1
    done
  done
  [ "$checked" -gt 0 ] || missing "no model in $shared/models has a reference in $shared/ref"
  ;;
perplexity)
  for q in q8_0 f16 f32; do
    for f in "$shared/ref/kjv-tiny-$q/perplexity.txt" "$shared/models/kjv-tiny-$q.gguf" "$shared/models/kjv-heldout.txt"; do
      [ -f "$f" ] || { echo "parity: kjv-tiny-$q perplexity: no $f"; continue 2; }
    done
    checked=$((checked + 1))
    want=$(ppl_of <"$shared/ref/kjv-tiny-$q/perplexity.txt")
    got=$("$minfer" perplexity -m "$shared/models/kjv-tiny-$q.gguf" -f "$shared/models/kjv-heldout.txt" -c 256 2>/dev/null |
          ppl_of)
    if perplexity_matches "$got" "$want"; then
      echo "kjv-tiny-$q perplexity $got (llama.cpp $want) PASS"
    else
      echo "kjv-tiny-$q perplexity $got (llama.cpp $want) FAIL"; status=1
    fi
  done
  [ "$checked" -eq 3 ] || missing "$((3 - checked)) of the 3 perplexity references could not run"
  ;;
esac
done
# Every CPU runs the scalar level: none means the binary could not even
# read the repository's own model, and nothing above was checked.
if [ "$levels" -eq 0 ]; then
  echo "parity: FAIL: '$minfer info $builtin' failed at every level: nothing checked"
  exit 1
fi
exit $status
