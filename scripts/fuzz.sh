#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang (-fsanitize=fuzzer,
# address,undefined) into build-fuzz/, writes their seed corpora, and runs each
# target for a bounded time. Exits non-zero if any target finds a crash, a
# leak, a timeout or a sanitizer report (the reproducer is left in
# build-fuzz/artifacts/).
#   FUZZ_SECONDS   seconds per target (default 60)
#   FUZZ_TARGETS   which targets (default: gguf tokenizer chat_template args alloc)
#   FUZZ_JOBS      build parallelism (default 2)
#   FUZZ_PARALLEL  targets fuzzed at once (default: the number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-gguf tokenizer chat_template args alloc}
jobs=${FUZZ_JOBS:-2}
parallel=${FUZZ_PARALLEL:-$(nproc)}

# Debian 12: clang 14 and its runtime libraries (libFuzzer lives in
# libclang-rt-14-dev).
MINFER_SETUP_EXTRA="clang libclang-rt-14-dev" ./scripts/setup.sh

out=build-fuzz
cmake -S fuzz -B "$out" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$out" -j"$jobs"

rm -rf "$out/seeds"
"$out/make_seeds" "$out/seeds"
cp fuzz/seeds/tokenizer/* "$out/seeds/tokenizer/" 2>/dev/null || true

# Sizes: a tiny model seed is ~15 KB; words and texts are short.
max_len_of() {
    case $1 in
        gguf) echo 65536 ;;
        tokenizer) echo 4096 ;;
        chat_template) echo 4096 ;;
        args) echo 1024 ;;
        alloc) echo 2048 ;;
    esac
}

mkdir -p "$out/artifacts" "$out/corpus"
status=0
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
run_target() {  # TARGET: one bounded run; non-zero on a finding
    local t=$1 log="$out/fuzz_$1.log"
    mkdir -p "$out/corpus/$t"
    echo "== fuzz: $t for ${seconds}s" >&2
    # The corpus dir comes first: new inputs are saved there and the next
    # run starts from them; the generated seeds are read too.
    if ! "$out/fuzz_$t" "$out/corpus/$t" "$out/seeds/$t" \
        -max_total_time="$seconds" -max_len="$(max_len_of "$t")" -rss_limit_mb=2048 \
        -timeout=10 -print_final_stats=1 -artifact_prefix="$out/artifacts/$t-" \
        >"$log" 2>&1; then
        echo "fuzz: $t FAILED (see $log and $out/artifacts/)" >&2
        grep -E "ERROR|SUMMARY|fuzz check failed|Test unit written" "$log" >&2 || tail -30 "$log" >&2
        return 1
    fi
    local runs cov
    runs=$(grep -E "^stat::number_of_executed_units" "$log" | awk '{print $2}')
    cov=$(grep -E "^#[0-9]+.*DONE" "$log" | tail -1 | sed -E 's/.*cov: ([0-9]+).*/\1/')
    echo "fuzz: $t ok: ${runs:-?} executions in ${seconds}s, coverage ${cov:-?} edges, corpus $(ls "$out/corpus/$t" | wc -l) files" >&2
}
# Each libFuzzer run is one process on one core: FUZZ_PARALLEL targets run at
# once (every run takes its FUZZ_SECONDS, so the oldest is waited for first).
pids=()
for t in $targets; do
    if [ ${#pids[@]} -ge "$parallel" ]; then
        wait "${pids[0]}" || status=1
        pids=("${pids[@]:1}")
    fi
    run_target "$t" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
