#!/bin/bash
# scripts/vs_llama.sh against a stand-in llama-bench (a script that logs its
# arguments and reports 40 t/s): the runs alternate minfer, llama.cpp,
# llama.cpp, minfer with the same arguments, each round's ratio is (sum of
# minfer's two) / (sum of llama.cpp's two), --avx2 caps minfer and gives
# llama-bench the library path, and bad input is refused with a message.
# usage: vs_llama_test.sh MINFER_BIN SOURCE_DIR
set -euo pipefail
unset LD_LIBRARY_PATH  # the stand-in logs it: only --avx2 may set it
minfer="$1"
src="$2"
script="$src/scripts/vs_llama.sh"
model="$src/models/kjv-tiny-q8_0.gguf"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}

cat >"$tmp/llama-bench" <<'EOF'
#!/bin/bash
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} $*" >>"$(dirname "$0")/calls.log"
echo '[{"avg_ts": 40.0, "test": "pp8"}]'
EOF
chmod +x "$tmp/llama-bench"

args=(-m "$model" -p 8 -n 0 -r 1 -t 1)
out=$("$script" --llama "$tmp" --rounds 2 --minfer "$minfer" -- "${args[@]}")
echo "$out"

# two rounds, each recomputed from its own printed figures
n=$(grep -c '^round ' <<<"$out")
[[ "$n" == 2 ]] || fail "expected 2 rounds, got $n"
while read -r _ r _ a _ b _ c _ d _ ratio; do
    want=$(python3 -c "print(f'{($a + $d) / ($b + $c):.2f}x')")
    [[ "$ratio" == "$want" ]] || fail "round ${r%:}: ratio $ratio, (minfer $a + $d) / (llama.cpp $b + $c) is $want"
    [[ "$b" == 40.00 && "$c" == 40.00 ]] || fail "round ${r%:}: llama.cpp's t/s should be the stand-in's 40.00"
    python3 -c "import sys; sys.exit(0 if float('$a') > 0 and float('$d') > 0 else 1)" ||
        fail "round ${r%:}: minfer's t/s should be positive"
done < <(grep '^round ' <<<"$out")
grep -q '^ratio over 2 rounds: min .*x  median .*x  max .*x$' <<<"$out" || fail "no summary line"

# llama-bench: twice a round, the same arguments plus -o json, no library path
[[ $(wc -l <"$tmp/calls.log") == 4 ]] || fail "llama-bench ran $(wc -l <"$tmp/calls.log") times, not 4"
want_call="LD_LIBRARY_PATH= ${args[*]} -o json"
while read -r call; do
    [[ "$call" == "$want_call" ]] || fail "llama-bench got '$call', not '$want_call'"
done <"$tmp/calls.log"

# --avx2: llama-bench gets the library path (minfer's cap is its own
# environment; a CPU without AVX2 refuses the cap, so it is not run here)
: >"$tmp/calls.log"
cat >"$tmp/minfer" <<'EOF'
#!/bin/bash
[[ "${MINFER_CPU:-}" == avx2 && "${MINFER_AVX_VNNI:-}" == 0 ]] || { echo "not capped" >&2; exit 1; }
echo '[{"avg_ts": 60.0, "test": "pp8"}]'
EOF
chmod +x "$tmp/minfer"
out=$("$script" --llama "$tmp" --rounds 1 --avx2 /opt/avx2lib --minfer "$tmp/minfer" -- "${args[@]}")
grep -q '^round 1: minfer 60.00  llama.cpp 40.00  llama.cpp 40.00  minfer 60.00  ratio 1.50x$' \
    <<<"$out" || fail "--avx2 round: $out"
grep -q '^LD_LIBRARY_PATH=/opt/avx2lib ' "$tmp/calls.log" || fail "--avx2 did not reach llama-bench"

# refusals, each naming what is wrong
expect_refusal() {
    local want="$1"
    shift
    local err
    if err=$("$script" "$@" 2>&1); then fail "accepted: $*"; fi
    grep -q -- "$want" <<<"$err" || fail "'$*' said '$err', not '$want'"
}
expect_refusal "no executable llama-bench in '$tmp/none'" --llama "$tmp/none" -- "${args[@]}"
expect_refusal "wants a positive number, not 'x'" --llama "$tmp" --rounds x -- "${args[@]}"
expect_refusal "unknown option '--bogus'" --llama "$tmp" --bogus
expect_refusal "ran 2 tests; give one" --llama "$tmp" --minfer "$minfer" -- -m "$model" -p 8 -n 4 -r 1 -t 1
expect_refusal "minfer failed" --llama "$tmp" --minfer "$minfer" -- -m "$tmp/missing.gguf" -p 8 -n 0 -r 1
echo "vs_llama: OK"
