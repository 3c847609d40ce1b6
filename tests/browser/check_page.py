#!/usr/bin/env python3
"""Checks what a person would see on a minfer viz page, from Chromium's
--dump-dom output, its console log and a screenshot (no third-party modules).

usage: check_page.py TRACE.json GRAPH_INDEX DOM.html CONSOLE.log SHOT.png
"""
import json
import re
import struct
import sys
import zlib


def fail(msg):
    print("browser test: FAIL: " + msg)
    sys.exit(1)


def expected_rows(g):
    """One row per region of the plan's own buffers (backend, id, offset of a
    non-aliased, non-KV node), plus one per KV region and per staging buffer —
    computed here independently of the page's script."""
    own = {(b["backend"], b["id"]) for b in g["buffers"] if b["kind"] in ("arena", "pool")}
    regions = set()
    for n in g["nodes"]:
        b = n["buffer"]
        if b is None or n["aliased"] or b["kv"]:
            continue
        if (b["backend"], b["id"]) in own:
            regions.add((b["backend"], b["id"], b["offset"]))
    kv = sum(1 for b in g["buffers"] if b["kind"] == "kv")
    staging = sum(1 for b in g["buffers"] if b["kind"] == "staging")
    return len(regions) + kv + staging


def png_colors(path):
    """Distinct colours of an 8-bit RGB/RGBA non-interlaced PNG."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(path + " is not a PNG")
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        ln, typ = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + ln]
        if typ == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                fail("unexpected PNG format %d/%d/%d" % (depth, ctype, interlace))
            bpp = 3 if ctype == 2 else 4
        elif typ == b"IDAT":
            idat += body
        pos += 12 + ln
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    colors = set()
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pr) & 255
        if y % 2 == 0:  # every other row is plenty to count colours
            for x in range(0, stride, bpp * 2):
                colors.add(bytes(line[x:x + 3]))
        prev = line
    return colors, w, h


def main():
    trace_path, gi, dom_path, console_path, shot = sys.argv[1:6]
    gi = int(gi)
    doc = json.load(open(trace_path))
    g = doc["graphs"][gi]
    dom = open(dom_path, encoding="utf-8").read()
    console = open(console_path, encoding="utf-8", errors="replace").read()

    bad = [l for l in console.splitlines() if "CONSOLE" in l and ("rror" in l or "Uncaught" in l)]
    if bad:
        fail("console errors:\n" + "\n".join(bad))
    m = re.search(r'<pre id="errors">(.*?)</pre>', dom, re.S)
    if m is None or m.group(1).strip():
        fail("the page reported errors: %r" % (m.group(1) if m else "no #errors element"))
    if 'data-ready="1"' not in dom:
        fail("the page did not finish rendering (body data-ready missing)")
    if ('data-graph="%d"' % gi) not in dom:
        fail("graph %d is not the one shown" % gi)

    m = re.search(r'id="stat-nodes">(\d+)<', dom)
    if not m:
        fail("no node count in the header")
    if int(m.group(1)) != len(g["nodes"]) or g["n_nodes"] != len(g["nodes"]):
        fail("header says %s nodes, the graph has %d" % (m.group(1), len(g["nodes"])))
    drawn = len(re.findall(r'<g class="node"', dom))
    if drawn != len(g["nodes"]):
        fail("%d nodes drawn, the graph has %d" % (drawn, len(g["nodes"])))
    dead_drawn = len(re.findall(r'<g class="node" data-node="\d+" data-dead="1"', dom))
    dead = sum(1 for n in g["nodes"] if n["dead"])
    if dead_drawn != dead:
        fail("%d dead nodes drawn, the graph has %d" % (dead_drawn, dead))

    rows = len(re.findall(r'<g class="tl-row"', dom))
    want = expected_rows(g)
    m = re.search(r'id="timeline"[^>]*data-rows="(\d+)"', dom)
    if rows != want or not m or int(m.group(1)) != want:
        fail("timeline has %d rows, expected one per buffer region: %d" % (rows, want))

    # The KV pages panel: one square per page of every snapshot, shared ones
    # (several holders) among them as the data says.
    snaps = doc.get("kv_pages", [])
    want_pages = sum(len(s["pages"]) for s in snaps)
    kv_drawn = len(re.findall(r'<rect [^>]*data-state="(?:free|cached|used)"', dom))
    if kv_drawn != want_pages:
        fail("%d KV pages drawn, the snapshots hold %d" % (kv_drawn, want_pages))
    want_shared = sum(s["counts"]["shared"] for s in snaps)
    shared_drawn = len(re.findall(r'data-state="used" data-holders="(?:[2-9]|\d\d)"', dom))
    if shared_drawn != want_shared:
        fail("%d shared KV pages drawn, the snapshots hold %d" % (shared_drawn, want_shared))

    colors, w, h = png_colors(shot)
    if len(colors) < 24:
        fail("screenshot %s looks blank: %d distinct colours" % (shot, len(colors)))
    print("browser test: graph %d (%s): %d nodes, %d dead, %d timeline rows, %d KV pages, screenshot %dx%d with %d colours: OK"
          % (gi, g["kind"], len(g["nodes"]), dead, rows, kv_drawn, w, h, len(colors)))


if __name__ == "__main__":
    main()
