#!/usr/bin/env bash
# Real clients against `minfer serve` on loopback, with the built-in tiny model:
#   1. the official OpenAI JavaScript library (npm package `openai`), the Vercel
#      AI SDK (`ai`) and LangChain (`@langchain/openai`),
#   2. the chat page at / in headless Chromium (puppeteer-core + Debian's chromium),
#   3. two replicas behind Debian's nginx (sticky by client key, /health checks),
#   4. a bounded load test (well-formed, malformed and abandoned requests), with
#      the built-in model and again with a mixture-of-experts one (qwen3moe-mini).
# Installs what it needs (npm ci into tests/client/, apt packages), starts
# each server on a free 127.0.0.1 port (--port 0), stops it, and fails on the
# first failing step. Takes well under a minute after the installs.
#
# usage: scripts/server_test.sh [BUILD_DIR]     (default: build)
# env:   SKIP_BROWSER=1 / SKIP_NGINX=1 / SKIP_LOAD=1 to leave a part out
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
bin="$build/minfer"
model="$root/models/kjv-tiny-q8_0.gguf"
[[ -x "$bin" ]] || { echo "server test: no $bin (build first)"; exit 1; }

apt_install() {
    local missing=()
    for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    echo "server test: installing ${missing[*]}"
    local sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
command -v node >/dev/null && command -v npm >/dev/null || apt_install nodejs npm
(cd "$root/tests/client" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)

work="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# start_server NAME ARGS...: starts minfer serve on a free port; sets $port.
start_server() {
    local name="$1"; shift
    "$bin" serve -m "${server_model:-$model}" --port 0 -t 1 "$@" >"$work/$name.log" 2>&1 &
    pids+=($!)
    local pid=$!
    for _ in $(seq 1 200); do
        port=$(sed -n 's/^minfer: serving .* on http:\/\/127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$work/$name.log" 2>/dev/null || true)
        [[ -n "$port" ]] && return 0
        kill -0 "$pid" 2>/dev/null || { cat "$work/$name.log"; echo "server test: $name did not start"; exit 1; }
        sleep 0.05
    done
    cat "$work/$name.log"; echo "server test: $name did not become ready"; exit 1
}
# stop_server PID NAME: SIGTERM, and the exit status must be 0.
stop_server() {
    kill -TERM "$1"
    local rc=0; wait "$1" || rc=$?
    [[ $rc -eq 0 ]] || { cat "$work/$2.log"; echo "server test: $2 exited $rc after SIGTERM"; exit 1; }
    grep -q "minfer: stopped" "$work/$2.log" || { echo "server test: $2 did not stop gracefully"; exit 1; }
}

# 1. The OpenAI library, then the Vercel AI SDK and LangChain (structured output).
start_server openai --api-key test-key -c 2048 -np 4
(cd "$root/tests/client" && MINFER_URL="http://127.0.0.1:$port/v1" MINFER_API_KEY=test-key \
    timeout 180 node --test openai_client.test.mjs sdk_clients.test.mjs) ||
    { tail -20 "$work/openai.log"; exit 1; }
stop_server "${pids[-1]}" openai
echo "server test: OpenAI library, AI SDK and LangChain clients passed"

# 2. The chat page in headless Chromium.
if [[ -z "${SKIP_BROWSER:-}" ]]; then
    browser=""
    for b in chromium chromium-browser; do command -v "$b" >/dev/null && browser="$(command -v "$b")" && break; done
    if [[ -z "$browser" ]]; then apt_install chromium; browser="$(command -v chromium)"; fi
    start_server chat -c 2048 -np 2
    (cd "$root/tests/client" && MINFER_ORIGIN="http://127.0.0.1:$port" CHROMIUM="$browser" \
        timeout 120 node --test chat_page.test.mjs) || { tail -20 "$work/chat.log"; exit 1; }
    stop_server "${pids[-1]}" chat
    echo "server test: chat page passed"
fi

# 3. Two replicas behind nginx.
if [[ -z "${SKIP_NGINX:-}" ]]; then
    "$root/tests/client/nginx_test.sh" "$bin" "$model" "$work"
fi

# 4. Bounded load test.
if [[ -z "${SKIP_LOAD:-}" ]]; then
    start_server load -c 4096 -np 4 --queue-limit 8 --max-body-size 65536
    timeout 180 python3 "$root/tests/client/load_test.py" --url "http://127.0.0.1:$port" \
        --requests 120 --concurrency 8 --seconds 90 || { tail -30 "$work/load.log"; exit 1; }
    stop_server "${pids[-1]}" load
    echo "server test: load test passed"

    # The same guarantees with a mixture-of-experts model (qwen3moe-mini:
    # router, top-k and expert matmuls in every pass): the MoE parity test's
    # file in the build tree, else one written by ../shared's synth_model.py.
    moe="$build/moe-models/qwen3moe-mini-q8_0.gguf"
    synth="${MINFER_SHARED_DIR:-$root/../shared}/tools/synth_model.py"
    if [[ ! -f "$moe" && -f "$synth" ]] && /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
        moe="$work/qwen3moe-mini-q8_0.gguf"
        /usr/bin/python3 "$synth" --preset qwen3moe-mini --ftype q8_0 -o "$moe" >/dev/null
    fi
    if [[ -f "$moe" ]]; then
        server_model="$moe" start_server load_moe -c 4096 -np 4 --queue-limit 8 --max-body-size 65536
        timeout 180 python3 "$root/tests/client/load_test.py" --url "http://127.0.0.1:$port" \
            --requests 60 --concurrency 8 --seconds 90 || { tail -30 "$work/load_moe.log"; exit 1; }
        stop_server "${pids[-1]}" load_moe
        echo "server test: load test on a MoE model passed"
    else
        echo "server test: MoE load test skipped (no $moe; ../shared/tools and python3-numpy write one)"
    fi
fi
echo "server test: passed"
