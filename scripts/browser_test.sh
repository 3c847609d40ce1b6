#!/usr/bin/env bash
# Browser test of the visual page (minfer viz): generates a page from the
# repo's tiny model, loads it in headless Chromium (Debian's package; nothing
# downloaded from elsewhere) and checks what a person would see — no console
# errors, the header's node count equals the graph's, one timeline row per
# buffer region, a screenshot that is not blank — for the prefill and the
# decode graph. Takes a few seconds.
#
# usage: scripts/browser_test.sh [BUILD_DIR]     (default: build)
# env:   MINFER_VIZ_MODEL=FILE to test another model's page
#        KEEP=DIR to keep the page, DOMs and screenshots in DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
bin="$build/minfer"
model="${MINFER_VIZ_MODEL:-$root/models/kjv-tiny-q8_0.gguf}"
[[ -x "$bin" ]] || { echo "browser test: no $bin (build first)"; exit 1; }

browser=""
for b in chromium chromium-browser; do command -v "$b" >/dev/null && browser="$(command -v "$b")" && break; done
if [[ -z "$browser" ]]; then
    echo "browser test: installing Debian's chromium"
    if [[ $(id -u) -eq 0 ]]; then apt-get install -y chromium >/dev/null; else sudo apt-get install -y chromium >/dev/null; fi
    browser="$(command -v chromium)"
fi

work="${KEEP:-$(mktemp -d)}"
mkdir -p "$work"
profile="$(mktemp -d)"
cleanup() { rm -rf "$profile"; [[ -n "${KEEP:-}" ]] || rm -rf "$work"; }
trap cleanup EXIT

"$bin" viz -m "$model" -p "And God said" -n 3 -t 1 --parallel 2 -o "$work/page.html" --save-trace "$work/trace.json" 2>"$work/viz.log" \
    || { cat "$work/viz.log"; exit 1; }
grep -qiE '(src|href)="(https?:)?//' "$work/page.html" && { echo "browser test: FAIL: the page references the network"; exit 1; }

flags=(--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update
       --disable-sync --no-first-run --user-data-dir="$profile" --hide-scrollbars --window-size=1400,1800)
n_graphs=$(/usr/bin/python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["graphs"]))' "$work/trace.json")
for ((gi = 0; gi < n_graphs; gi++)); do
    url="file://$work/page.html#graph=$gi"
    timeout 60 "$browser" "${flags[@]}" --enable-logging=stderr --v=0 --virtual-time-budget=3000 --dump-dom "$url" \
        >"$work/dom$gi.html" 2>"$work/console$gi.log" || { tail -20 "$work/console$gi.log"; exit 1; }
    timeout 60 "$browser" "${flags[@]}" --virtual-time-budget=3000 --screenshot="$work/shot$gi.png" "$url" \
        >/dev/null 2>&1 || { echo "browser test: FAIL: no screenshot"; exit 1; }
    /usr/bin/python3 "$root/tests/browser/check_page.py" "$work/trace.json" "$gi" "$work/dom$gi.html" \
        "$work/console$gi.log" "$work/shot$gi.png"
done
echo "browser test: passed ($n_graphs graphs)"
