#!/usr/bin/env bash
# Builds and runs the tests under the sanitizers:
#   1. AddressSanitizer + UndefinedBehaviorSanitizer (build-asan): every CTest
#      test except the slow parity.* runs against ../shared.
#   2. ThreadSanitizer (build-tsan): the tests that run several threads (the
#      thread pool, the queue backend, the scheduler, kernels on two threads,
#      forward passes over two backends, generation through the binary,
#      every engine test (Engine\.: submit/cancel from client threads against
#      its step loop, steps of many sequences on two kernel threads, the
#      randomized run) and every server test (Serve*: HTTP threads, the
#      engine thread, streaming, hang-ups, the queue). Patterns, not names,
#      so new Engine/Serve tests are covered as they are added.
# Any sanitizer report fails the test that triggered it (halt_on_error), so
# the script exits non-zero. Usage: scripts/sanitize.sh [asan|tsan|all]
# (default all). JOBS sets the build parallelism (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
which_builds=${1:-all}
jobs=${JOBS:-2}

./scripts/setup.sh

# The "asan" and "tsan" presets of CMakePresets.json (build-asan, build-tsan):
# -O1 -g1 (line tables for the reports), the kernels at -O2 (CMakeLists.txt);
# -fno-omit-frame-pointer comes from MINFER_SANITIZE.
configure_and_build() {  # preset
    cmake --preset "$1" >/dev/null
    cmake --build --preset "$1" -j"$jobs"
}

status=0
start=$(date +%s)

if [ "$which_builds" = all ] || [ "$which_builds" = asan ]; then
    echo "== sanitize: ASan + UBSan build (build-asan)" >&2
    configure_and_build asan
    # detect_leaks: the tests and the CLI must free what they allocate.
    # The mapped model of a failed load, a bad_alloc in flight: all freed.
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
    (cd build-asan && ctest --output-on-failure -j"$jobs" -E '^parity') || status=1
    unset ASAN_OPTIONS UBSAN_OPTIONS
fi

if [ "$which_builds" = all ] || [ "$which_builds" = tsan ]; then
    echo "== sanitize: TSan build (build-tsan)" >&2
    configure_and_build tsan
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/scripts/tsan.supp"
    threaded='^(ThreadPool\.|Backends\.|Scheduler\.|CpuMatMul\.|CpuOps\.|CpuAttn\.|CpuFusion\.|Forward\.TwoBackends|Forward\.DecodeSteps|Forward\.PromptInSeveralPasses|Limits\.|Cli\.Default|Cli\.Chat|Engine\.|Serve[A-Za-z]*\.|Cache\.no_allocation_nor_scratch_growth_after_first_decode_with_real_kernels)'
    # Left out: ServeStructured.JsonObjectRepliesAreObjects, a minute of
    # sampling at temperature 2 until replies close (ten times that under
    # TSan); its threads are those of the other ServeStructured tests, and the
    # mask thread is exercised by Engine.Constrained*.
    (cd build-tsan && ctest --output-on-failure -j"$jobs" -R "$threaded" \
        -E '^ServeStructured\.JsonObjectRepliesAreObjects$') || status=1
    unset TSAN_OPTIONS
fi

echo "== sanitize: done in $(($(date +%s) - start)) s, status $status" >&2
exit $status
