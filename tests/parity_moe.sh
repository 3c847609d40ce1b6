#!/usr/bin/env bash
# Parity of the MoE architectures with llama.cpp: the qwen3moe-mini and
# qwen2moe-mini files (../shared/tools/synth_model.py, seeded and
# deterministic) at F32, Q8_0 and Q4_K_M (minfer quantize of the F32 file,
# which gives llama-quantize's types and bits) and one block of the real
# qwen3-30b-a3b shape at Q8_0, their logits against
# llama.cpp's in tests/ref/moe (README there), whole prompt and passes of 64
# tokens; the greedy text of llama-completion where a folder has
# greedy_text.json, the perplexity of llama-perplexity (within 0.5 %) where
# it has perplexity.txt; once per kernel level this CPU has. The files are
# written once into MODELS_DIR (the build tree) and reused.
set -euo pipefail
minfer="$1"
shared="$2"
models="$3"
here="$(cd "$(dirname "$0")" && pwd)"
refs="$here/ref/moe"
py=/usr/bin/python3
. "$here/parity_perplexity.sh"
missing() {
  if [ "${MINFER_REQUIRE_SHARED:-}" = 1 ]; then
    echo "parity_moe: FAIL: $1 (MINFER_REQUIRE_SHARED=1)"; exit 1
  fi
  echo "parity_moe: skipped: $1"
  exit 77
}
for f in "$shared/tools/synth_model.py" "$shared/tools/compare_logits.py"; do
  [ -f "$f" ] || missing "no $f"
done
$py -c 'import numpy' 2>/dev/null || missing "no numpy for $py (apt-get install -y python3-numpy)"
mkdir -p "$models"
for p in qwen3moe-mini qwen2moe-mini; do
  for t in f32 q8_0; do
    [ -f "$models/$p-$t.gguf" ] ||
      $py "$shared/tools/synth_model.py" --preset $p --ftype $t -o "$models/$p-$t.gguf" >/dev/null
  done
  [ -f "$models/$p-q4_k_m.gguf" ] ||
    "$minfer" quantize "$models/$p-f32.gguf" "$models/$p-q4_k_m.gguf" Q4_K_M 2>/dev/null
done
# The real-shape file: the first block of qwen3-30b-a3b (2048 wide, 128
# experts of 768, 8 chosen, Qwen's whole vocabulary, untied output), 1.3 GB.
real=qwen3-30b-a3b-1l-q8_0
[ -f "$models/$real.gguf" ] ||
  $py "$shared/tools/synth_model.py" --preset qwen3-30b-a3b --n-layer 1 --ftype q8_0 \
    -o "$models/$real.gguf" >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The stored references keep the last 2 of the 8 last rows, in f16 (the
# vocabulary is Qwen's 151936 tokens: 8 f32 rows are 4.9 MB a file); both
# sides are given to compare_logits.py as those 2 rows repeated 4 times.
eight_rows() {  # SRC (f16 2 rows | f32 8 rows) DST
  $py - "$1" "$2" <<'PY'
import sys, numpy as np
src, dst = sys.argv[1], sys.argv[2]
if src.endswith(".f16"):
    rows = np.fromfile(src, dtype="<f2").astype("<f4").reshape(2, -1)
else:
    rows = np.fromfile(src, dtype="<f4").reshape(8, -1)[6:]
np.tile(rows, (4, 1)).astype("<f4").tofile(dst)
PY
}
# The perplexity references score the first 1100 bytes of the held-out
# text (3 windows of 64 tokens): a few seconds a model.
[ -f "$shared/models/kjv-heldout.txt" ] || missing "no $shared/models/kjv-heldout.txt"
head -c 1100 "$shared/models/kjv-heldout.txt" >"$out/heldout.txt"
status=0
builtin="$here/../models/kjv-tiny-q8_0.gguf"
for level in scalar avx2 avx512 neon dotprod i8mm; do
  MINFER_CPU=$level "$minfer" info "$builtin" >/dev/null 2>&1 || continue
  export MINFER_CPU=$level
  echo "== MINFER_CPU=$level"
  for ref in "$refs"/*/; do
    m=$(basename "$ref")
    mkdir -p "$out/ref-$m"
    cp "$ref/logits_topk.jsonl" "$out/ref-$m/"
    eight_rows "$ref/logits_last2.f16" "$out/ref-$m/logits_last8.f32"
    for b in 0 64; do
      c="$out/$m-$b"
      "$minfer" logits -m "$models/$m.gguf" --tokens "$refs/tokens.json" --out "$c" -b "$b" 2>/dev/null
      eight_rows "$c/logits_last8.f32" "$c/last8"
      mv "$c/last8" "$c/logits_last8.f32"
      printf '%-22s -b %-3s ' "$m" "$b"
      $py "$shared/tools/compare_logits.py" "$out/ref-$m" "$c" || status=1
    done
    if [ -f "$ref/greedy_text.json" ]; then
      read -r n_predict prompt < <($py -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["n_predict"], d["prompt"])' "$ref/greedy_text.json")
      "$minfer" -m "$models/$m.gguf" -p "$prompt" -n "$n_predict" --temp 0 --ignore-eos 2>/dev/null >"$out/greedy.txt"
      printf '%-22s greedy text ' "$m"
      if $py -c 'import json,sys; want=json.load(open(sys.argv[1]))["text"]; got=open(sys.argv[2],encoding="utf-8").read().removesuffix("\n"); print("PASS" if got == want else "FAIL: %r (llama.cpp %r)" % (got, want)); sys.exit(got != want)' \
          "$ref/greedy_text.json" "$out/greedy.txt"; then :; else status=1; fi
    fi
    if [ -f "$ref/perplexity.txt" ]; then
      want=$(ppl_of <"$ref/perplexity.txt")
      got=$("$minfer" perplexity -m "$models/$m.gguf" -f "$out/heldout.txt" -c 64 2>/dev/null | ppl_of)
      printf '%-22s perplexity %s (llama.cpp %s) ' "$m" "$got" "$want"
      if perplexity_matches "$got" "$want"; then
        echo PASS
      else
        echo FAIL; status=1
      fi
    fi
  done
done
exit $status
