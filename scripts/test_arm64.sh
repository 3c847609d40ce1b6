#!/usr/bin/env bash
# Builds minfer for ARM64 with Debian's cross compiler and runs its tests
# under qemu-aarch64 (user-mode emulation), once per emulated CPU:
#   cortex-a72  ARMv8.0: NEON only (no sdot, no i8mm)
#   max         every feature qemu emulates: NEON + dotprod + i8mm
# The kernel tests run every ISA level the emulated CPU offers, and the
# summary lists per level which kernels have a NEON path, which fall back
# to the portable code, and which prompt GEMM runs (arm/gemm_neon.h: smmla
# at i8mm, sdot at dotprod, vmull at neon; none at scalar). The
# end-to-end checks (greedy text of the built-in model, logits parity with
# llama.cpp on ../shared/ref) run on the `max` CPU when ../shared is there
# (MINFER_SHARED names another directory). Without it they are skipped,
# unless MINFER_REQUIRE_SHARED=1 (CI): then a missing reference or model is
# a failure, and a missing ../shared fails at once, before the build.
# Emulation says nothing about speed: it checks correctness only.
#
# Works from a fresh clone, as root or through sudo (scripts/setup.sh), and
# writes only build-arm64/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
start=$(date +%s)
lap() { echo "arm64: $1 ($(( $(date +%s) - start )) s)"; }
shared="${MINFER_SHARED:-$root/../shared}"
require_shared=${MINFER_REQUIRE_SHARED:-}
if [ "$require_shared" = 1 ]; then
  for f in "$shared/ref" "$shared/tools/compare_logits.py" "$shared/ref/kjv-tiny-greedy.json"; do
    [ -e "$f" ] || { echo "arm64: FAIL: no $f (MINFER_REQUIRE_SHARED=1)" >&2; exit 1; }
  done
fi

# 1. Packages: the cross compiler, the emulator, the host packages the build
#    reads (cmake, GoogleTest's source in /usr/src/googletest, the header-only
#    nlohmann-json), and Debian's arm64 cpp-httplib for the server (a compiled
#    library: its header declares what libcpp-httplib.so defines). That one
#    comes through multiarch, so dpkg must know the arm64 architecture first;
#    it pulls the arm64 OpenSSL, zlib and brotli it links with, installed in
#    /usr/lib/aarch64-linux-gnu beside the host's libraries.
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo dpkg --add-architecture arm64
  $sudo apt-get update -qq
fi
MINFER_SETUP_EXTRA="g++-aarch64-linux-gnu qemu-user libcpp-httplib-dev:arm64 ${MINFER_SETUP_EXTRA:-}" ./scripts/setup.sh
lap "packages present"

out="$root/build-arm64"
deps="$out/_deps"
toolchain="$root/cmake/aarch64-linux-gnu.cmake"
jobs=$(nproc)
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
# The guest's libraries from the cross sysroot first: its loader
# (ld-linux-aarch64.so.1 under QEMU_LD_PREFIX) must run with the libc it was
# built with. Without this the loader reads the host's ld.so.cache and takes
# the multiarch libc6:arm64 that cpp-httplib's package pulled in, a newer
# build of glibc whose internals differ from the loader's: the first
# pthread_create then spins forever in a lock.
export QEMU_SET_ENV="LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib"
# A reserved guest address space (64 GiB): without it qemu-user 7.2 searched
# the host's for each new mapping, and the Serve fixture's first thread stack
# (after the model's mappings) took minutes of CPU to place, no syscall made.
export QEMU_RESERVED_VA=0x1000000000
mkdir -p "$out"

# 2. GoogleTest for arm64, built with the cross compiler from the source
#    Debian ships with libgtest-dev (multiarch libgtest-dev:arm64 would pull
#    an arm64 libc next to the host's; the source build needs nothing more).
if [ ! -f "$deps/lib/cmake/GTest/GTestConfig.cmake" ]; then
  cmake -S /usr/src/googletest -B "$deps/googletest-build" -DCMAKE_TOOLCHAIN_FILE="$toolchain" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$deps" -DBUILD_GMOCK=ON >/dev/null
  cmake --build "$deps/googletest-build" -j"$jobs" >/dev/null
  cmake --install "$deps/googletest-build" >/dev/null
  lap "GoogleTest built for arm64"
fi
# nlohmann-json is headers only: a prefix holding just those headers and the
# host's CMake config (which finds its headers relative to itself), so the
# cross build never sees the host's /usr/include.
if [ ! -f "$deps/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake" ]; then
  mkdir -p "$deps/include" "$deps/share/cmake"
  ln -sfn /usr/include/nlohmann "$deps/include/nlohmann"
  cp -r /usr/share/cmake/nlohmann_json "$deps/share/cmake/"
fi

# cpp-httplib's pkg-config file names /usr/lib/aarch64-linux-gnu, which the
# toolchain's find root (the cross sysroot and $deps) re-roots: $deps gets a
# link to it. Its OpenSSL headers include <openssl/opensslconf.h>, which
# multiarch keeps in /usr/include/aarch64-linux-gnu: searched after the cross
# sysroot's headers (-idirafter), so that libc's headers still come first.
mkdir -p "$deps/usr/lib"
ln -sfn /usr/lib/aarch64-linux-gnu "$deps/usr/lib/aarch64-linux-gnu"
export PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig

# 3. minfer itself (no benchmarks: Google Benchmark is not built for arm64,
#    and emulated timings mean nothing).
export MINFER_ARM64_DEPS="$deps"
# The "arm64" preset of CMakePresets.json: the same toolchain, build-arm64/
# and its _deps (the server on, cpp-httplib's OpenSSL headers after the
# cross sysroot's: -idirafter, see above).
cmake --preset arm64 >/dev/null
cmake --build --preset arm64 -j"$jobs"
lap "minfer built for arm64"
# ELF e_machine (bytes 18-19) 0xb7 = EM_AARCH64: the build really cross-compiled.
[ "$(od -An -tx1 -j18 -N2 "$out/minfer_tests" | tr -d ' ')" = "b700" ] ||
  { echo "arm64: minfer_tests is not an arm64 binary" >&2; exit 1; }

# A wrapper so scripts that run the CLI (tests/parity.sh) run the arm64 one.
cli="$out/minfer-qemu"
printf '#!/bin/sh\nexec qemu-aarch64 "%s" "$@"\n' "$out/minfer" >"$cli"
chmod +x "$cli"

# 4. The tests. Tests that start the CLI as a child process (Cli*,
#    ServeCli.*, and the ones that use cli_runner.h) cannot exec an arm64
#    binary without binfmt_misc, which a container may lack; the CLI is
#    checked below through the wrapper instead. Emulation runs what depends
#    on the architecture: the kernels at each ISA level, the forward pass,
#    and the engine, its KV pages and the server on them (Engine.*:
#    bitwise alone vs batched; KvPages.*; Serve*: HTTP threads, streaming,
#    hang-ups, the queue, concurrent requests bitwise against alone). The
#    randomized engine run takes 100 requests here (300 natively).
#    ServeStructured.* stays native: its sampling until replies close costs
#    minutes under emulation, and what it checks (grammars, masks over the
#    vocabulary) is the same code on every architecture; Engine.Constrained*
#    runs the mask thread beside the NEON kernels.
filter_kernels="IsaLevels*:Cpu*:Quants*:Interleave*"
filter_all="$filter_kernels:Forward*:KvPages.*:Engine.*:Serve*-ServeCli.*:ServeStructured.*"
export MINFER_RANDOMIZED_REQUESTS=100
status=0
run_tests() {  # NAME QEMU_CPU MINFER_CPU FILTER: the log, and NAME.rc its exit status
  local name="$1" cpu="$2" level="$3" filter="$4" log="$out/tests-$1.log" rc=0
  echo "arm64: [$name] minfer_tests on qemu -cpu $cpu${level:+, MINFER_CPU=$level}"
  # Bounded: a hang under emulation fails this lane with its log, instead of
  # running into CI's limit (the lanes take a few minutes).
  QEMU_CPU="$cpu" MINFER_CPU="$level" timeout "${MINFER_ARM64_LANE_TIMEOUT:-1200}" \
    qemu-aarch64 "$out/minfer_tests" --gtest_filter="$filter" >"$log" 2>&1 || rc=$?
  [ "$rc" != 124 ] || echo "arm64: [$name] timed out; last test started: $(grep '^\[ RUN' "$log" | tail -1)" >&2
  echo "$rc" >"$out/tests-$name.rc"
  lap "tests [$name]"
}
report_tests() {  # NAME: its failures, ISA lines and summary line
  local name="$1" log="$out/tests-$1.log"
  if [ "$(cat "$out/tests-$name.rc")" != 0 ]; then
    status=1
    grep -E "^\[  FAILED  \]|Failure|error" "$log" | head -40 >&2 || true
  fi
  grep -E "^ISA levels|^kernels at" "$log" | sort -u || true
  local line
  line=$(grep -E "^\[  (PASSED|FAILED)  \].*tests?" "$log" | head -1 || true)
  summary+=("[$name] $(grep -E '^\[==========\] .* ran' "$log" || echo 'no summary: crashed?') ${line}")
}
# max (NEON + dotprod + i8mm): the whole filtered suite at the best level;
# beside it (each qemu process emulates one test thread at a time, and the
# machine has more cores), the kernel tests capped at each lower level, then
# on cortex-a72 (ARMv8.0, NEON only) at its detected level.
rm -f "$out"/tests-*.rc "$out"/tests-*.log
run_tests max max "" "$filter_all" &
lane_max=$!
run_tests max-scalar max scalar "$filter_kernels"
run_tests max-neon max neon "$filter_kernels"
run_tests cortex-a72 cortex-a72 "" "$filter_kernels"
wait "$lane_max" || true
summary=()
for name in max max-scalar max-neon cortex-a72; do report_tests "$name"; done

# 5. End to end on the arm64 CLI (on the max CPU), when ../shared is there.
export QEMU_CPU=max
if [ -d "$shared/ref" ] && [ -f "$shared/tools/compare_logits.py" ]; then
  # The built-in model (-m omitted: models/kjv-tiny-q8_0.gguf, the file the
  # reference used) must continue the prompt with llama.cpp's 24 greedy
  # tokens, whose top-1 margins all exceed 0.249.
  /usr/bin/python3 - "$cli" "$shared/ref/kjv-tiny-greedy.json" <<'PY' || status=1
import json, subprocess, sys
cli, ref_path = sys.argv[1], sys.argv[2]
ref = json.load(open(ref_path))
got = subprocess.run([cli, "-p", ref["prompt"], "-n", str(len(ref["generated"])), "--temp", "0",
                      "--no-display-prompt"], capture_output=True, text=True, check=True).stdout
# llama.cpp's text ends in the blank line its CLI prints after a
# generation; minfer prints one newline: compare without trailing newlines.
if got.rstrip("\n") == ref["text"].rstrip("\n"):
    print(f"arm64: greedy text of the built-in model matches llama.cpp's ({len(ref['generated'])} tokens): PASS")
else:
    print(f"arm64: greedy text differs: FAIL\n  want {ref['text']!r}\n  got  {got!r}")
    sys.exit(1)
PY
  # Logits against llama.cpp's, at compare_logits.py's default bounds. Under
  # emulation a 512-token pass of a qwen mini model costs over a minute of
  # CPU, so by default (CI's time): the three kjv-tiny files (the Q8_0 one
  # whole and in passes of 64) and the K-quant qwen3 model once;
  # MINFER_ARM64_PARITY=all runs tests/parity.sh's full set.
  if [ "${MINFER_ARM64_PARITY:-}" = all ]; then
    "$root/tests/parity.sh" "$cli" "$shared" logits || status=1
  else
    tmp=$(mktemp -d)
    checked=0
    for run in kjv-tiny-q8_0:0 kjv-tiny-q8_0:64 kjv-tiny-f16:0 kjv-tiny-f32:0 \
               qwen3-mini-q4_k_m:0; do
      m=${run%:*} b=${run#*:}
      if [ ! -f "$shared/models/$m.gguf" ]; then
        if [ "$require_shared" = 1 ]; then
          echo "arm64: FAIL: no $shared/models/$m.gguf (MINFER_REQUIRE_SHARED=1)"; status=1
        else
          echo "arm64: logits $m skipped: no $shared/models/$m.gguf"
        fi
        continue
      fi
      checked=$((checked + 1))
      "$cli" logits -m "$shared/models/$m.gguf" --tokens "$shared/ref/$m/tokens.json" \
        --out "$tmp/$m-$b" -b "$b" 2>/dev/null || { echo "$m -b $b: minfer logits failed"; status=1; continue; }
      printf 'arm64: logits %-20s -b %-3s ' "$m" "$b"
      /usr/bin/python3 "$shared/tools/compare_logits.py" "$shared/ref/$m" "$tmp/$m-$b" || status=1
    done
    rm -rf "$tmp"
    [ "$checked" -gt 0 ] || echo "arm64: no logits check ran: none of its models is in $shared/models"
  fi
  lap "end-to-end checks on the arm64 CLI"
else
  echo "arm64: ../shared absent: greedy-text and logits parity checks skipped (they need its reference files)"
fi

echo "arm64: kernels per ISA level (vec_dot: own NEON path or portable; attention; prompt GEMM):"
for level in scalar neon dotprod i8mm; do
  cat "$out"/tests-*.log 2>/dev/null | grep -m1 -E "^kernels at $level:" | sed 's/^/  /' || true
done
echo "arm64: test counts per emulated CPU:"
printf '  %s\n' "${summary[@]}"
[ $status -eq 0 ] && echo "arm64: PASS" || echo "arm64: FAIL"
exit $status
