"""Helpers of the docs tests (imported by them; pytest puts this folder on sys.path): the page
generator's modules, a short run through the command line, and a real headless browser
(Debian's ``chromium``) that reports a broken image, a broken link or a script error and keeps a
screenshot of each page.

The browser is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``), with
the standard library only.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parents[2]
SCREENS = Path(os.environ.get("TRIMTAB_SCREENS", "/tmp/screens"))


def gen(module: str) -> ModuleType:
    """A module of the docs' page generator (``docs/gen/``), imported as the site build does."""
    if str(ROOT / "docs") not in sys.path:
        sys.path.insert(0, str(ROOT / "docs"))
    return importlib.import_module(f"gen.{module}")


def train_run(out: Path, *extra: str) -> Path:
    """A two-fold market run of a few seconds on the CPU, through the command line."""
    sets = [
        "run.progress=false",
        "walkforward.folds=2",
        "walkforward.steps_per_fold=30",
        "walkforward.learning_starts=64",
        "backtest.random_draws=8",
        "backtest.bootstrap_draws=50",
        "run.log_every=4",
        "agent.hidden=16",
        "agent.batch_size=16",
        "env.n_envs=4",
    ]
    cmd = [sys.executable, "-m", "trimtab", "train", "--out", str(out), *extra]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out / "report.html"


def prices_with_defects(folder: Path) -> None:
    """Two assets' daily CSVs, 700 business days; BBB misses 20 days (a gap, and what AAA
    loses to alignment) and halves on one day with no Adj Close (a split-like jump)."""
    import numpy as np

    rng = np.random.default_rng(0)
    days = np.busday_offset("2015-01-01", np.arange(700), roll="forward")
    folder.mkdir(parents=True)
    for name in ("AAA", "BBB"):
        close = 100 * np.exp(np.cumsum(rng.normal(2e-4, 0.01, len(days))))
        keep = np.ones(len(days), bool)
        if name == "BBB":
            keep[300:320] = False
            close[500:] /= 2
        lines = ["Date,Open,High,Low,Close,Volume"]
        for d, c, k in zip(days, close, keep):
            if k:
                lines.append(f"{d},{c:.4f},{c * 1.004:.4f},{c * 0.996:.4f},{c:.4f},1000000")
        (folder / f"{name}.csv").write_text("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------------------------
# a headless browser over the DevTools protocol


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Chromium with ``--remote-debugging-pipe``: commands are NUL-terminated JSON written to its
    fd 3, replies and events come back on its fd 4."""

    def __init__(self, exe: str, width: int = 1280, height: int = 900) -> None:
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()
        self.profile = Path(os.environ.get("TMPDIR", "/tmp")) / f"trimtab-chromium-{os.getpid()}"
        args = [
            exe,
            "--headless=new",
            "--remote-debugging-pipe",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--allow-file-access-from-files",
            f"--user-data-dir={self.profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ]

        def fds() -> None:
            # via fresh copies: dup2 onto the same number would keep its close-on-exec flag
            r, w = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        # dup2 leaves fds 3 and 4 inheritable; close_fds would close them after preexec_fn
        self.proc = subprocess.Popen(
            args,
            close_fds=False,
            preexec_fn=fds,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        self.width, self.height = width, height

    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        return self._id

    def _read(self, timeout: float) -> dict:
        import select

        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(
        self, method: str, params: dict | None = None, session: str | None = None, timeout=30.0
    ) -> dict:
        want = self._send(method, params, session)
        while True:
            msg = self._read(timeout)
            if msg.get("id") == want:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method: str, session: str, timeout: float = 30.0) -> dict:
        for i, ev in enumerate(self.events):
            if ev.get("method") == method and ev.get("sessionId") == session:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read(max(0.01, deadline - time.monotonic()))
            if msg.get("method") == method and msg.get("sessionId") == session:
                return msg
            self.events.append(msg)

    def open(self, url: str, shot: Path | None = None, max_height: int = 8000) -> dict:
        """Load ``url`` in a fresh tab; return what a reader would trip over: script errors,
        failed loads, broken images, and the page's links; save a full-page screenshot."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=s)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
            session=s,
        )
        self.events = [e for e in self.events if e.get("sessionId") != s]
        self.call("Page.navigate", {"url": url}, session=s)
        self.wait_event("Page.loadEventFired", s)
        time.sleep(0.3)  # late scripts (the theme's search index, images decoding)
        probe = self.call(
            "Runtime.evaluate",
            {
                "expression": """JSON.stringify({
                    broken: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0))
                              .map(i => i.getAttribute('src')),
                    images: document.images.length,
                    links: [...document.querySelectorAll('a[href]')].map(a => a.href),
                    ids: [...document.querySelectorAll('[id]')].map(e => e.id),
                    title: document.title,
                    url: location.href.split('#')[0],
                    height: document.documentElement.scrollHeight,
                })""",
                "returnByValue": True,
            },
            session=s,
        )
        page = json.loads(probe["result"]["value"])
        errors = []
        failed = []
        for ev in self.events:
            if ev.get("sessionId") != s:
                continue
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                errors.append(d.get("exception", {}).get("description") or d.get("text"))
            elif m == "Runtime.consoleAPICalled" and p.get("type") == "error":
                errors.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in p["args"])
                )
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                errors.append(p["entry"].get("text", "") + " " + p["entry"].get("url", ""))
            elif m == "Network.loadingFailed" and not p.get("canceled"):
                failed.append(p.get("errorText"))
        if shot is not None:
            height = min(max_height, int(page["height"]))
            self.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": self.width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session=s,
            )
            data = self.call("Page.captureScreenshot", {"format": "png"}, session=s)["data"]
            shot.parent.mkdir(parents=True, exist_ok=True)
            shot.write_bytes(base64.b64decode(data))
        self.call("Target.closeTarget", {"targetId": target})
        page.update(errors=errors, failed=failed)
        return page

    def close(self) -> None:
        with contextlib.suppress(Exception):  # it may be gone already; it is killed below
            self.call("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._w)
        os.close(self._r)
        shutil.rmtree(self.profile, ignore_errors=True)


def broken_local_links(page: dict, root: Path | None = None, origin: str = "") -> list[str]:
    """The page's links to local files that do not exist: ``file://`` links, and links under
    ``origin`` (the test's HTTP server) mapped onto ``root``; and links to an anchor of the page
    itself that the page does not have."""
    bad = []
    for href in page["links"]:
        u = urlparse(href)
        if u.scheme == "file":
            path = Path(unquote(u.path))
        elif origin and href.startswith(origin) and root is not None:
            path = root / unquote(u.path).lstrip("/")
        else:
            continue
        if path.is_dir():
            path = path / "index.html"
        own_anchor = u.fragment and href.split("#")[0] == page["url"]
        if not path.exists() or (own_anchor and u.fragment not in page["ids"]):
            bad.append(href)
    return bad


class Served:
    """The built site over HTTP on a free local port (Material's search needs http, not file)."""

    def __init__(self, root: Path) -> None:
        import functools
        import http.server
        import threading

        handler = functools.partial(_QuietHandler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _quiet_handler():
    import http.server

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    return Quiet


_QuietHandler = _quiet_handler()


def save_shot(tmp: Path, name: str) -> Path:
    return tmp / "screens" / f"{name}.png"


def keep(shot: Path) -> None:
    """Copy a screenshot to SCREENS (default /tmp/screens) for a person to look at."""
    try:
        SCREENS.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, SCREENS / shot.name)
    except OSError:
        pass
