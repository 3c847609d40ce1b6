#!/bin/bash
# minfer bench against llama.cpp's llama-bench on the same host, model and
# arguments, in alternated rounds: minfer, llama.cpp, llama.cpp, minfer. A
# host whose speed drifts within minutes (shared or throttled machines) then
# moves both sides of a round alike; a round's ratio is the sum of minfer's
# two t/s over the sum of llama.cpp's two.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/vs_llama.sh --llama DIR [--rounds N] [--avx2 LIBDIR] [--minfer BIN] -- ARGS

  --llama DIR     the directory holding llama-bench (a llama.cpp build's bin/)
  --rounds N      alternated rounds (default 3)
  --avx2 LIBDIR   minfer capped at AVX2 without AVX-VNNI (MINFER_CPU=avx2
                  MINFER_AVX_VNNI=0), llama-bench run with LD_LIBRARY_PATH=LIBDIR
                  (the directory of an AVX2-only libggml-cpu build)
  --minfer BIN    the minfer binary (default: build/minfer of this checkout)
  ARGS            given to both, one test: -m MODEL.gguf -p 512 -n 0 -r 3 -t 2
                  (a prompt test) or -p 0 -n 128 (a generation test)

Prints each round's four t/s and its ratio, then the ratios' min, median and
max. Example:
  scripts/vs_llama.sh --llama ~/llama.cpp/build/bin -- -m m.gguf -p 512 -n 0 -r 3 -t 2
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
minfer="$here/../build/minfer"
llama_dir=""
rounds=3
avx2_lib=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --llama) llama_dir="${2:?--llama needs a directory}"; shift 2 ;;
        --rounds) rounds="${2:?--rounds needs a number}"; shift 2 ;;
        --avx2) avx2_lib="${2:?--avx2 needs the AVX2 libggml-cpu directory}"; shift 2 ;;
        --minfer) minfer="${2:?--minfer needs a binary}"; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        --) shift; break ;;
        *) echo "vs_llama.sh: unknown option '$1' (the bench arguments go after --)" >&2
           usage >&2; exit 2 ;;
    esac
done
if [[ -z "$llama_dir" || $# -eq 0 ]]; then
    usage >&2
    exit 2
fi
if [[ ! "$rounds" =~ ^[1-9][0-9]*$ ]]; then
    echo "vs_llama.sh: --rounds wants a positive number, not '$rounds'" >&2
    exit 2
fi
if [[ ! -x "$llama_dir/llama-bench" ]]; then
    echo "vs_llama.sh: no executable llama-bench in '$llama_dir'" >&2
    exit 2
fi
if [[ ! -x "$minfer" ]]; then
    echo "vs_llama.sh: no minfer binary at '$minfer' (build it, or give --minfer)" >&2
    exit 2
fi

minfer_env=()
llama_env=()
if [[ -n "$avx2_lib" ]]; then
    minfer_env=(MINFER_CPU=avx2 MINFER_AVX_VNNI=0)
    llama_env=("LD_LIBRARY_PATH=$avx2_lib")
fi

# One run's t/s: the avg_ts of the single test in its JSON.
tps() {
    local who="$1"
    shift
    local out err
    err=$(mktemp)
    if ! out=$(env "$@" -o json 2>"$err"); then
        echo "vs_llama.sh: $who failed:" >&2
        tail -n 5 "$err" >&2
        rm -f "$err"
        exit 1
    fi
    rm -f "$err"
    python3 -c '
import json, sys
tests = json.loads(sys.argv[2])
if len(tests) != 1:
    sys.exit(f"vs_llama.sh: {sys.argv[1]} ran {len(tests)} tests; give one (-p N -n 0 or -p 0 -n N)")
tps = tests[0]["avg_ts"]
print(f"{tps:.2f}")' "$who" "$out"
}

ratios=()
for ((r = 1; r <= rounds; ++r)); do
    a=$(tps minfer "${minfer_env[@]}" "$minfer" bench "$@")
    b=$(tps llama-bench "${llama_env[@]}" "$llama_dir/llama-bench" "$@")
    c=$(tps llama-bench "${llama_env[@]}" "$llama_dir/llama-bench" "$@")
    d=$(tps minfer "${minfer_env[@]}" "$minfer" bench "$@")
    ratio=$(python3 -c "print(f'{($a + $d) / ($b + $c):.2f}')")
    ratios+=("$ratio")
    echo "round $r: minfer $a  llama.cpp $b  llama.cpp $c  minfer $d  ratio ${ratio}x"
done
python3 -c '
import statistics, sys
r = sorted(float(x) for x in sys.argv[1:])
print(f"ratio over {len(r)} rounds: min {r[0]:.2f}x  median {statistics.median(r):.2f}x  max {r[-1]:.2f}x")
' "${ratios[@]}"
