#!/usr/bin/env python3
"""Load generator for `minfer serve` (or llama-server: same API), standard library only.

What it sends: REQUESTS streamed chat completions from CLIENTS concurrent
clients (all start at once; each sends its next request when the previous
one is done), temperature 0, ignore_eos, max_tokens GEN,
stream_options.include_usage. Each user message is a distinct numbered
text of about PROMPT tokens; with --shared-system N every request also
carries the same system prompt of about N tokens (sized with /tokenize).

What it prints: wall time, aggregate generated tokens/s (all completion
tokens / wall time), time to first token p50/p90/max, per-request totals,
and the prompt and cached tokens the server reported.

  scripts/serve_bench.py --url http://127.0.0.1:8080 --clients 8 --requests 16 --prompt 100 --gen 64
  scripts/serve_bench.py --url http://127.0.0.1:8080 --clients 4 --requests 8 --shared-system 1100 --prompt 20 --gen 16
"""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse

WORDS = ("the river runs past the old mill where children count stones and the baker sings "
         "about bread rain mountains lanterns harvest quiet roads copper bells").split()


def text_of(n_words, seed):
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(n_words))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt", type=int, default=100, help="user-message tokens (about)")
    p.add_argument("--gen", type=int, default=64, help="tokens generated per request")
    p.add_argument("--shared-system", type=int, default=0, help="tokens of a system prompt shared by all")
    p.add_argument("--api-key", default="")
    a = p.parse_args()
    u = urllib.parse.urlparse(a.url)
    headers = {"Content-Type": "application/json"}
    if a.api_key:
        headers["Authorization"] = "Bearer " + a.api_key

    def call(path, body):
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
        c.request("POST", path, json.dumps(body), headers)
        r = c.getresponse()
        return r.status, r.read()

    def sized(n_tokens, seed):  # a text of about n_tokens tokens, measured with /tokenize
        words = max(1, n_tokens)
        for _ in range(6):
            t = text_of(words, seed)
            s, b = call("/tokenize", {"content": t})
            if s != 200:
                return t
            n = len(json.loads(b)["tokens"])
            if abs(n - n_tokens) <= 2:
                return t
            words = max(1, round(words * n_tokens / max(n, 1)))
        return t

    system = sized(a.shared_system, 999) if a.shared_system else None
    users = [f"Request {i}. " + sized(a.prompt, i) for i in range(a.requests)] if a.prompt else []
    results, lock, next_i = [], threading.Lock(), [0]
    t0 = time.monotonic()

    def client():
        while True:
            with lock:
                i = next_i[0]
                if i >= a.requests:
                    return
                next_i[0] += 1
            msgs = ([{"role": "system", "content": system}] if system else []) + \
                   [{"role": "user", "content": users[i]}]
            body = {"model": "bench", "messages": msgs, "max_tokens": a.gen, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            start = time.monotonic()
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
            c.request("POST", "/v1/chat/completions", json.dumps(body), headers)
            r = c.getresponse()
            ttft, usage, buf = None, None, b""
            while True:
                chunk = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                        continue
                    j = json.loads(ev[6:])
                    if j.get("usage"):
                        usage = j["usage"]
                    for ch in j.get("choices", []):
                        if ttft is None and (ch.get("delta") or {}).get("content"):
                            ttft = time.monotonic() - start
            end = time.monotonic()
            with lock:
                results.append({"status": r.status, "ttft": ttft if ttft is not None else end - start,
                                "total": end - start, "usage": usage or {}})

    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    bad = [r for r in results if r["status"] != 200]
    gen = sum(r["usage"].get("completion_tokens", 0) for r in results)
    prompt = sum(r["usage"].get("prompt_tokens", 0) for r in results)
    cached = sum((r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) for r in results)
    ttfts = sorted(r["ttft"] for r in results)
    q = lambda f: ttfts[min(len(ttfts) - 1, int(f * len(ttfts)))]  # noqa: E731
    print(f"requests {len(results)} ({len(bad)} failed) from {a.clients} clients; wall {wall:.2f} s")
    print(f"generated {gen} tokens: {gen / wall:.2f} tokens/s aggregate")
    print(f"prompt tokens {prompt}, cached {cached}")
    print(f"time to first token: p50 {statistics.median(ttfts):.2f} s, p90 {q(0.9):.2f} s, max {ttfts[-1]:.2f} s")
    print(f"request time: p50 {statistics.median(r['total'] for r in results):.2f} s, max "
          f"{max(r['total'] for r in results):.2f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
