#!/usr/bin/env bash
# Two `minfer serve` replicas behind Debian's nginx on loopback
# (tests/client/nginx.conf.in): the same client key always reaches the same
# replica, different keys reach both, streaming passes through unbuffered,
# and when a replica goes away its keys move to the other one.
# usage: nginx_test.sh MINFER_BINARY MODEL WORK_DIR     (called by scripts/server_test.sh)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$1"; model="$2"; work="$3/nginx"
mkdir -p "$work"
# nginx, and iproute2's ss (the unbuffered check reads the kernel's byte counts).
missing=()
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx)
command -v ss >/dev/null || [[ -x /usr/bin/ss ]] || missing+=(iproute2)
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "nginx test: installing Debian's ${missing[*]}"
    sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
nginx_bin="$(command -v nginx || echo /usr/sbin/nginx)"

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    [[ -f "$work/nginx.pid" ]] && kill -TERM "$(cat "$work/nginx.pid")" 2>/dev/null || true
}
trap cleanup EXIT

start_replica() {  # NAME -> sets $port
    "$bin" serve -m "$model" --port 0 -t 1 -c 2048 -np 2 --alias "$1" >"$work/$1.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 200); do
        port=$(sed -n 's/^minfer: serving .* on http:\/\/127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$work/$1.log" 2>/dev/null || true)
        [[ -n "$port" ]] && return 0
        sleep 0.05
    done
    cat "$work/$1.log"; echo "nginx test: replica $1 did not start"; exit 1
}
start_replica replica-a; port_a=$port; pid_a=${pids[-1]}
start_replica replica-b; port_b=$port
front=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
sed -e "s|@WORK@|$work|g" -e "s|@PORT@|$front|g" -e "s|@REPLICA_A@|$port_a|g" -e "s|@REPLICA_B@|$port_b|g" \
    "$here/nginx.conf.in" >"$work/nginx.conf"
"$nginx_bin" -t -q -p "$work" -c "$work/nginx.conf" 2>>"$work/nginx-error.log" \
    || { cat "$work/nginx-error.log"; exit 1; }
"$nginx_bin" -p "$work" -c "$work/nginx.conf"
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$front/health" >/dev/null && break; sleep 0.05; done

python3 - "$front" "$pid_a" "$port_a" <<'EOF'
import http.client, json, os, re, signal, subprocess, sys, threading, time, zlib
front, pid_a, port_a = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def stream_through(port, key, received, errors):
    """A 1000-token stream at temperature 0 through `port`; received[0] is the
    number of body bytes read so far (chunked framing and gzip removed)."""
    try:
        body = json.dumps({"messages": [{"role": "user", "content": "And God said"}], "max_tokens": 1000,
                           "temperature": 0, "ignore_eos": True, "stream": True})
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        # Accept-Encoding as browsers send it: a proxy that compresses must
        # not hold events back either.
        c.request("POST", "/v1/chat/completions", body,
                  {"Content-Type": "application/json", "X-Client-Key": key, "Accept-Encoding": "gzip"})
        r = c.getresponse()
        assert r.status == 200, r.status
        gz = zlib.decompressobj(wbits=31) if r.getheader("Content-Encoding") == "gzip" else None
        data = b""
        while chunk := r.read1(65536):
            data += gz.decompress(chunk) if gz else chunk
            received[0] = len(data)
        assert data.rstrip().endswith(b"data: [DONE]"), data[-200:]
    except Exception as e:  # noqa: BLE001 (reported by the caller)
        errors.append(repr(e))

def nginx_received_from(port):
    """Bytes that nginx's connections to `port` have received so far, per
    connection (the kernel's tcp_info bytes_received, through iproute2's ss)."""
    out = subprocess.run(["ss", "-tinpH", f"dport = :{port}"], capture_output=True, text=True, check=True).stdout
    got, conn = {}, None
    for line in out.splitlines():
        if line and not line[0].isspace():
            conn = tuple(line.split()[3:5]) if '"nginx"' in line else None
            if conn:
                got[conn] = 0
        elif conn and (m := re.search(r"bytes_received:(\d+)", line)):
            got[conn] = int(m.group(1))
    return got

def ask(key, stream=False):
    c = http.client.HTTPConnection("127.0.0.1", front, timeout=60)
    body = {"messages": [{"role": "user", "content": "And God said"}], "max_tokens": 6,
            "temperature": 0, "ignore_eos": True, "stream": stream}
    c.request("POST", "/v1/chat/completions", json.dumps(body),
              {"Content-Type": "application/json", "X-Client-Key": key})
    r = c.getresponse()
    data = r.read().decode()
    assert r.status == 200, (r.status, data[:200])
    if stream:
        assert "text/event-stream" in r.getheader("Content-Type"), r.getheaders()
        assert data.rstrip().endswith("data: [DONE]"), data[-100:]
        return json.loads(data.split("\n\n")[0][6:])["model"]
    return json.loads(data)["model"]   # the replica's --alias (no "model" sent)

keys = [f"user-{i}" for i in range(16)]
where = {k: ask(k) for k in keys}
for k in keys:                       # sticky: again, and streamed, the same replica
    assert ask(k) == where[k], (k, where[k])
    assert ask(k, stream=True) == where[k], k
assert set(where.values()) == {"replica-a", "replica-b"}, f"all keys on one replica: {where}"
# Unbuffered: a stream through nginx from replica a (its key). Once the
# replica has generated 20 of its tokens it is paused (SIGSTOP): what nginx
# had received from it by then (the kernel counts it per connection) must
# reach the client while the stream is still open. A proxy that buffers holds
# it until its buffer fills or the stream ends. (Counting reads or timing
# events cannot tell on a busy machine: nginx runs seldom and sends many
# events a write, buffering or not, and the tiny model's 1000 tokens take
# well under a second.)
key_a = next(k for k in keys if where[k] == "replica-a")
metrics = http.client.HTTPConnection("127.0.0.1", port_a, timeout=10)
def generated():                     # replica a's engine: tokens generated since it started
    metrics.request("GET", "/metrics")
    text = metrics.getresponse().read().decode()
    return float(re.search(r"^minfer_generated_tokens_total (\S+)", text, re.M).group(1))
def paused_stream():
    """(bytes nginx had received when the replica paused, in all; bytes the
    client had by then, in all)."""
    before = nginx_received_from(port_a)
    seen = dict(before)              # a connection that closes keeps its count
    def nginx_received():
        seen.update(nginx_received_from(port_a))
        return sum(n - before.get(conn, 0) for conn, n in seen.items())
    g0 = generated()
    received, errors = [0], []
    reader = threading.Thread(target=stream_through, args=(front, key_a, received, errors))
    reader.start()
    deadline = time.monotonic() + 60
    while generated() - g0 < 20 and reader.is_alive() and time.monotonic() < deadline:
        pass
    os.kill(pid_a, signal.SIGSTOP)
    try:
        time.sleep(0.2)              # what the replica wrote lands in nginx's socket
        upstream = nginx_received()  # headers, chunk sizes and events
        deadline = time.monotonic() + 5
        while received[0] < upstream * 0.9 and time.monotonic() < deadline:
            time.sleep(0.01)
        got = received[0]
    finally:
        os.kill(pid_a, signal.SIGCONT)
    reader.join()
    assert not errors, errors
    return upstream, nginx_received(), got, received[0]
# A try in which the stream ended before the pause (a busy machine) tells
# nothing: up to three.
for attempt in range(3):
    upstream, upstream_total, got, total = paused_stream()
    if 2048 <= upstream <= upstream_total - 4096:
        break
    print(f"nginx test: the replica was not paused mid-stream (nginx had {upstream} of {upstream_total} bytes): again")
else:
    raise AssertionError("the replica could not be paused mid-stream in three tries")
# The floor leaves room for the chunk framing the replica sends and the
# last event's bytes in flight.
assert got >= upstream // 2, \
    f"nginx buffered the stream: {got} of the {upstream} bytes it had received reached the client while the replica was paused"
print(f"nginx test: replica paused when nginx had {upstream} of {upstream_total} bytes; {got} bytes of events "
      f"had reached the client ({total} in all)")
on_a = [k for k in keys if where[k] == "replica-a"]
os.kill(pid_a, signal.SIGTERM)       # replica a leaves
time.sleep(1.0)
for k in on_a:
    assert ask(k) == "replica-b", k  # its keys move to b
c = http.client.HTTPConnection("127.0.0.1", front, timeout=10)
c.request("GET", "/health", headers={"X-Client-Key": on_a[0]})
r = c.getresponse()
assert r.status == 200 and json.loads(r.read())["status"] == "ok", r.status
print(f"nginx test: passed ({len(on_a)} of {len(keys)} keys on replica a, sticky; moved to b when a stopped)")
EOF
