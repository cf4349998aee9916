#!/usr/bin/env python3
"""Neuroglancer's own client, in headless Chromium, draws what rechunkfs
serves; the picture is compared with the known pattern.

    neuroglancer_check.py make IN [--blocks 16,32,32]   (HDF5 blocks of the pattern, by h5py)
    neuroglancer_check.py check LINK --shot OUT.png [--deadline 90] [--range LO,HI]

The pattern is a (16, 64, 64) uint16 array in tiles of 8x8x8 voxels, each
tile one value: 1000 + 32 * p, p a permutation of 0..63 within each z
tile. A swapped or truncated 8x8x8 chunk shows as wrong tiles.

`check` serves the client bundled in the `neuroglancer` PyPI package (its
page under /v/TOKEN/ and an event stream at /events/TOKEN, as its Python
integration does) on a free loopback port, opens it with the state of
LINK (the link `rechunkfs serve` prints) plus an xy panel at z = 4 with
the UI hidden and a magenta background, waits until `viewer.isReady()`
(every visible chunk loaded) or the deadline, takes a screenshot, finds
the drawn slice (what is not magenta), samples the centre of each tile
and compares its grey with the one the state's shader range gives the
tile's value. Prints a JSON summary; exits 1 on any wrong tile.
"""
import argparse
import http.server
import json
import os
import shutil
import socketserver
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np

SHAPE = (16, 64, 64)
TILE = 8
Z = 4  # the slice shown, in tile row 0 along z
MAGENTA = (255, 0, 255)


def pattern():
    z, y, x = np.indices(SHAPE) // TILE
    p = ((y * 8 + x) * 29 + 17 * z) % 64
    return (1000 + 32 * p).astype("<u2")


def make(args):
    import h5py

    data = pattern()
    root = Path(args.input)
    root.mkdir(parents=True)
    block = tuple(int(x) for x in args.blocks.split(","))
    for i in range(SHAPE[0] // block[0]):
        for j in range(SHAPE[1] // block[1]):
            for k in range(SHAPE[2] // block[2]):
                box = tuple(slice(n * b, (n + 1) * b) for n, b in zip((i, j, k), block))
                with h5py.File(root / f"{i}_{j}_{k}.h5", "w") as f:
                    f["data"] = data[box]


class Client(http.server.BaseHTTPRequestHandler):
    """Neuroglancer's bundled client, and an event stream that stays open."""

    static = None
    token = "rechunkfs"

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = urllib.parse.urlparse(self.path).path
        if path == f"/events/{self.token}":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b": keep-alive\n\n")
                    self.wfile.flush()
                    time.sleep(5)
            except OSError:
                return
        prefix = f"/v/{self.token}/"
        if not path.startswith(prefix):
            self.send_error(404)
            return
        name = path[len(prefix):] or "index.html"
        file = (self.static / name).resolve()
        if self.static not in file.parents or not file.is_file():
            self.send_error(404)
            return
        body = file.read_bytes()
        types = {".js": "application/javascript", ".css": "text/css", ".html": "text/html",
                 ".wasm": "application/wasm"}
        self.send_response(200)
        self.send_header("Content-Type", types.get(file.suffix, "application/octet-stream"))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def state_of(link):
    fragment = link.split("#!", 1)[1]
    state = json.loads(urllib.parse.unquote(fragment))
    dims = state["dimensions"]
    z_name = state["displayDimensions"][2]
    names = list(dims)
    position = [0.5 * SHAPE[2], 0.5 * SHAPE[1], 0.5 * SHAPE[0]] + [0.5] * (len(names) - 3)
    position[names.index(z_name)] = Z + 0.5
    state.update(
        layout="xy",
        position=position,
        crossSectionScale=1 / 8,  # 8 pixels a voxel: the slice is 512 pixels wide
        showAxisLines=False,
        showScaleBar=False,
        showDefaultAnnotations=False,
        crossSectionBackgroundColor="#ff00ff",
        hideCrossSectionBackground3D=True,
    )
    state["selectedLayer"] = {"visible": False}
    state["statistics"] = {"visible": False}
    return state


def browser(width, height):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="rechunkfs-chromium-")
    for flag in [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
        "--disable-features=BackForwardCache", f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
    ]:
        options.add_argument(flag)
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(options=options, service=Service(executable_path=driver_path)), profile


def compare(png, state):
    """Wrong tiles of the slice drawn in the screenshot `png`."""
    import io

    from PIL import Image

    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    drawn = np.any(image != MAGENTA, axis=2)
    # The panel is the magenta area; the slice is drawn at its centre: walk
    # out from there to the magenta around it.
    rows = np.where((~drawn).sum(axis=1) > image.shape[1] // 4)[0]
    cols = np.where((~drawn).sum(axis=0) > image.shape[0] // 4)[0]
    if rows.size == 0 or cols.size == 0:
        return {"error": "no magenta panel in the screenshot"}, 64
    cy, cx = (rows.min() + rows.max()) // 2, (cols.min() + cols.max()) // 2
    if not drawn[cy, cx]:
        return {"error": "nothing drawn at the panel's centre"}, 64
    y0, y1, x0, x1 = cy, cy + 1, cx, cx + 1
    while y0 > 0 and drawn[y0 - 1, cx]:
        y0 -= 1
    while y1 < image.shape[0] and drawn[y1, cx]:
        y1 += 1
    while x0 > 0 and drawn[cy, x0 - 1]:
        x0 -= 1
    while x1 < image.shape[1] and drawn[cy, x1]:
        x1 += 1
    layer = state["layers"][0]
    lo, hi = layer["shaderControls"]["normalized"]["range"]
    expected = pattern()[Z]
    wrong = []
    for ty in range(8):
        for tx in range(8):
            py = int(y0 + (ty + 0.5) * (y1 - y0) / 8)
            px = int(x0 + (tx + 0.5) * (x1 - x0) / 8)
            grey = image[py, px]
            value = expected[ty * TILE, tx * TILE]
            want = np.clip((value - lo) / (hi - lo), 0, 1) * 255
            if not (abs(grey[0] - grey[1]) <= 1 and abs(grey[1] - grey[2]) <= 1
                    and abs(grey[0] - want) <= 2.5):
                wrong.append({"tile": [ty, tx], "grey": grey.tolist(), "want": round(want, 1)})
    box = {"box": [int(y0), int(x0), int(y1), int(x1)], "wrong": wrong[:8]}
    return box, len(wrong)


def check(args):
    state = state_of(args.link)
    if "shaderControls" not in state["layers"][0]:
        # Without a range the pattern (1000-3016 of uint16) is drawn almost
        # black, every tile alike: no comparison would mean anything.
        if not args.range:
            print(json.dumps({"error": "the link gives no shader range", "wrong_tiles": 64}))
            return 1
        lo, hi = (float(x) for x in args.range.split(","))
        state["layers"][0]["shaderControls"] = {"normalized": {"range": [lo, hi]}}
    import neuroglancer

    Client.static = (Path(neuroglancer.__file__).parent / "static" / "client").resolve()
    server = Server(("127.0.0.1", 0), Client)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = (f"http://127.0.0.1:{server.server_address[1]}/v/{Client.token}/#!"
           + urllib.parse.quote(json.dumps(state)))
    driver, profile = browser(800, 800)
    summary = {"ready": False}
    try:
        driver.set_page_load_timeout(60)
        driver.get(url)
        deadline = time.monotonic() + args.deadline
        while time.monotonic() < deadline:
            ready = driver.execute_script(
                "return typeof viewer !== 'undefined' && viewer.isReady();")
            if ready:
                summary["ready"] = True
                break
            time.sleep(0.25)
        summary["waited_seconds"] = round(args.deadline - (deadline - time.monotonic()), 1)
        time.sleep(0.5)  # one more frame drawn after the last chunk arrived
        png = driver.get_screenshot_as_png()
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
        server.shutdown()
    Path(args.shot).write_bytes(png)
    found, wrong = compare(png, state)
    summary.update(found, wrong_tiles=wrong, tiles=64)
    print(json.dumps(summary))
    return 0 if wrong == 0 and summary["ready"] else 1


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("input")
    m.add_argument("--blocks", default="16,32,32")
    c = sub.add_parser("check")
    c.add_argument("link")
    c.add_argument("--shot", required=True)
    c.add_argument("--deadline", type=float, default=90)
    c.add_argument("--range", help="the shader's range, where LINK gives none")
    args = parser.parse_args()
    if args.command == "make":
        make(args)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
