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
if ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]]; then
    echo "nginx test: installing Debian's nginx"
    sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nginx >/dev/null
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
        port=$(sed -n 's/^minfer: serving .* on http:\/\/127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$work/$1.log")
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
import http.client, json, os, signal, socket, sys, time
front, pid_a, port_a = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def stream_reads(port, key):
    """A 1000-token stream read from a raw socket: the number of events and
    the number of socket reads that brought at least one event's end. A
    proxy that buffers delivers a stream in a few buffer-sized pieces; one
    that passes events through delivers them about as they are made."""
    body = json.dumps({"messages": [{"role": "user", "content": "And God said"}], "max_tokens": 1000,
                       "temperature": 0, "ignore_eos": True, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sk:
        sk.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                   b"X-Client-Key: " + key.encode() + b"\r\nContent-Type: application/json\r\n"
                   b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got, reads = b"", 0
        while True:
            chunk = sk.recv(65536)
            if not chunk:
                break
            ends = (got + chunk).count(b"\n\n") - got.count(b"\n\n")
            reads += ends > 0
            got += chunk
    assert b"data: [DONE]" in got, got[-200:]
    return got.count(b"data: "), reads

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
# Unbuffered: a stream through nginx arrives in about as many pieces as
# straight from the replica (the same request, its key on replica a).
key_a = next(k for k in keys if where[k] == "replica-a")
events, direct = stream_reads(port_a, key_a)
_, proxied = stream_reads(front, key_a)
# (The server sends what is new each time its stream wakes: on a busy
# machine several tokens share an event, hence a modest floor.)
assert direct >= 20, f"the replica itself sent {events} events in only {direct} reads"
assert proxied >= direct // 2, \
    f"nginx buffered the stream: {events} events in {proxied} reads (straight from the replica: {direct})"
print(f"nginx test: a {events}-event stream arrived in {proxied} reads through nginx, {direct} direct")
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
