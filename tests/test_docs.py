"""The docs as a person sees them: the generated pages, the strict site build, and a run's
report.html and the built site opened in a real headless browser (Debian's ``chromium``), which
fails on a broken image, a broken link or a script error and keeps a screenshot of each page.

The browser is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``), with
the standard library only. Without ``chromium`` on the PATH the browser tests skip (CI installs
it: ``.ci/run``); without mkdocs (the ``[docs]`` extra) the site tests skip.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCREENS = Path(os.environ.get("TRIMTAB_SCREENS", "/tmp/screens"))


def _gen(module: str):
    """A module of the docs' page generator (``docs/gen/``), imported as the site build does."""
    if str(ROOT / "docs") not in sys.path:
        sys.path.insert(0, str(ROOT / "docs"))
    return importlib.import_module(f"gen.{module}")


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


@pytest.fixture(scope="module")
def browser():
    exe = chromium()
    if exe is None:
        pytest.skip("chromium is not installed (CI installs it: apt-get install chromium)")
    b = Browser(exe)
    yield b
    b.close()


# ----------------------------------------------------------------------------------------------
# the generated pages


def test_results_loader_reads_bare_nan_and_null(tmp_path):
    fmt = _gen("markdown").fmt
    path = tmp_path / "r.json"
    path.write_text('{"date": "2026-01-01", "rows": [{"a": NaN, "b": null, "c": Infinity}]}')
    data = _gen("records").load_json(path)
    row = data["rows"][0]
    assert math.isnan(row["a"]) and row["b"] is None and row["c"] == math.inf
    assert fmt(row["a"]) == fmt(row["b"]) == "n/a"
    assert "n/a" in _gen("sections").file_section(path)


def test_every_results_file_is_on_a_page_with_its_command_and_provenance():
    pages = _gen("results").result_pages()
    text = "\n".join(v for v in pages.values() if isinstance(v, str))
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        assert f"`{path.name}`" in text, path.name
    assert "results/other.md" not in pages, "a results file is on no page: place it in PAGES"
    assert "```bash\npython benchmarks/" in pages["results/stability.md"]
    assert "(no script recorded" not in text


def test_trading_page_states_the_verdict_from_the_json():
    signed = _gen("markdown").signed
    data = _gen("records").load_json(ROOT / "benchmarks" / "results" / "agent_vs_baselines.json")
    runs = _gen("trading").default_runs(data)
    text = _gen("results").result_pages()["results/trading.md"]
    verdict = text.split("## Verdict")[1].split("\n## ")[0]
    for key, rec, var in runs:
        agg = var["aggregate"]
        para = next(p for p in verdict.split("\n\n") if f"`{key}`" in p)
        assert signed(agg["agent"]["mean"]) in para and signed(agg["buy_and_hold"]["mean"]) in para
        beats = agg["targets"]["above"]["buy_and_hold"]
        assert ("does not beat buy & hold" in para) == (not beats), para
        assert f"{100 * agg['targets']['oracle_fraction']:.0f}%" in para
        assert str(rec["date"]) in text  # the provenance of the record it comes from
    assert any(set(r.get("seeds", [])) == {0, 1, 2, 3, 4} for _, r, _ in runs)


def test_reproduce_commands_come_from_the_scripts():
    scripts = _gen("scripts")
    cmd = scripts.reproduce_command(scripts.script_for("agent_vs_baselines"))
    assert cmd.startswith("python benchmarks/") and "agent_vs_baselines.py --seeds" in cmd
    assert scripts.script_for("stress_fp16") == scripts.script_for("stress")


# ----------------------------------------------------------------------------------------------
# the site and the report, in a browser


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_site_builds_with_every_section(site):
    for page in (
        "getting-started/install",
        "guides/library",
        "concepts/invariants",
        "reference/config",
        "reference/api/library",
        "results/trading",
    ):
        assert (site / page / "index.html").exists(), page
    api = (site / "reference/api/library/index.html").read_text()
    assert "guard.step" in api or "step" in api
    assert "Guard" in api


#: pages of the site opened in the browser (one per section; the rest share their templates)
SITE_PAGES = [
    "",
    "getting-started/first-run/",
    "getting-started/report/",
    "guides/library/",
    "concepts/invariants/",
    "reference/config/",
    "reference/api/library/",
    "results/trading/",
    "results/stability/",
]


@pytest.mark.slow
def test_site_pages_in_a_browser(site, browser, tmp_path):
    served = Served(site)
    problems = []
    try:
        for rel in SITE_PAGES:
            name = "site-" + (rel.strip("/").replace("/", "-") or "home")
            shot = save_shot(tmp_path, name)
            page = browser.open(f"{served.origin}/{rel}", shot)
            keep(shot)
            for kind in ("errors", "failed", "broken"):
                if page[kind]:
                    problems.append(f"{rel or '/'}: {kind}: {page[kind]}")
            bad = broken_local_links(page, site, served.origin)
            if bad:
                problems.append(f"{rel or '/'}: broken links: {bad}")
            assert shot.stat().st_size > 10_000, f"{rel}: an empty screenshot"
    finally:
        served.close()
    assert not problems, "\n".join(problems)


def _train(out: Path, *extra: str) -> Path:
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


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """The embedded market: every baseline, the oracle among them; no data warnings."""
    return _train(tmp_path_factory.mktemp("run") / "run", "--set", "data.synthetic_days=400")


def _prices_with_defects(folder: Path) -> None:
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


@pytest.fixture(scope="module")
def report_warned(tmp_path_factory) -> Path:
    """Your own data, with the defects the data guide says are reported, never absorbed."""
    tmp = tmp_path_factory.mktemp("warned")
    _prices_with_defects(tmp / "prices")
    return _train(tmp / "run", "--data", str(tmp / "prices"))


def test_report_in_a_browser(report, browser, tmp_path):
    shot = save_shot(tmp_path, "report")
    page = browser.open(report.as_uri(), shot, max_height=16000)
    keep(shot)
    assert not page["errors"], page["errors"]
    assert not page["failed"], page["failed"]
    assert not page["broken"], page["broken"]
    assert page["images"] >= 4, "the report shows its plots"
    assert not broken_local_links(page, report.parent)
    html = report.read_text()
    # a trader's order: the verdict and the data warnings, the pooled backtest beside the
    # baselines, its dated plots, the folds, then the training diagnostics
    order = ["best simple baseline", "Data", "Pooled out of sample", "Out-of-sample plots",
             "Out-of-sample results per fold", "Training diagnostics"]  # fmt: skip
    at = [html.find(h) for h in order]
    assert all(i >= 0 for i in at) and at == sorted(at), dict(zip(order, at))


def test_report_with_data_warnings_in_a_browser(report_warned, browser, tmp_path):
    """The warnings stand out before any figure, each said once, and flag what they touch."""
    shot = save_shot(tmp_path, "report-data-warnings")
    page = browser.open(report_warned.as_uri(), shot, max_height=16000)
    keep(shot)
    assert not page["errors"] and not page["failed"] and not page["broken"], page
    html = report_warned.read_text()
    box = html.split("<div class=warn>")[1].split("</div>")[0]
    for kind in ("gap", "alignment", "split"):
        assert f"<td>{kind}</td>" in box, kind
    assert box.count("20 business days missing") == 1, "a warning said twice"
    assert "Read the data warnings first" in html
    at = [html.find(h) for h in ("class=verdict", "Data warnings", "Pooled out of sample")]
    assert all(i >= 0 for i in at) and at == sorted(at), at


def test_training_plots_name_the_window_each_fold_trained_on():
    import numpy as np

    from trimtab.rl.report.plots import _train_windows, figure

    ax = figure().subplots()
    step, fold = np.arange(1.0, 7.0), np.array([0.0, 0, 0, 1, 1, 1])
    folds = [{"fold": 0, "train_start": "2010-02-03", "train_end": "2010-07-23"},
             {"fold": 1, "train_start": "2010-07-29", "train_end": "2011-01-17"}]  # fmt: skip
    _train_windows(ax, step, fold, folds)
    assert [t.get_text() for t in ax.texts] == [
        " fold 0: trained on 2010-02-03 … 2010-07-23",
        " fold 1: trained on 2010-07-29 … 2011-01-17",
    ]
    assert [t.get_position()[0] for t in ax.texts] == [1.0, 4.0]


# ----------------------------------------------------------------------------------------------
# the guides' code runs as written

DOCS = sorted((ROOT / "docs").rglob("*.md"))


def _blocks(lang: str) -> list[tuple[Path, str]]:
    import re

    out = []
    for path in DOCS:
        for code in re.findall(rf"```{lang}\n(.*?)```", path.read_text(), re.S):
            out.append((path, code))
    return out


def test_docs_python_examples_run():
    blocks = _blocks("python")
    assert blocks
    for path, code in blocks:
        exec(compile(code, str(path), "exec"), {})


def _commands() -> list[tuple[Path, list[str]]]:
    import shlex

    out = []
    for path, code in _blocks("bash") + [(ROOT / "README.md", c) for c in _readme_bash()]:
        for line in code.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("torchrun "):
                line = "trimtab " + line.split(" -m trimtab ", 1)[1]
            if line.startswith("trimtab "):
                out.append((path, shlex.split(line)[1:]))
    return out


def _readme_bash() -> list[str]:
    import re

    return re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_every_trimtab_command_in_the_docs_parses_and_its_config_builds():
    """Each ``trimtab ...`` line of the README and the docs is accepted by the command line's
    parser, and each ``train`` line's config (its --set keys and values) builds."""
    from trimtab.cli import build_parser
    from trimtab.rl.run.cli import build_config

    commands = _commands()
    assert len(commands) > 15
    parser = build_parser()
    for path, argv in commands:
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{path.name}: trimtab {' '.join(argv)}: refused by the parser")
        if argv[0] == "train" and not args.resume and not args.seeds:
            if args.config and not (ROOT / args.config).exists():
                continue
            cwd = os.getcwd()
            os.chdir(ROOT)
            try:
                build_config(args)
            except Exception as e:
                pytest.fail(f"{path.name}: trimtab {' '.join(argv)}: {e}")
            finally:
                os.chdir(cwd)


def test_short_commands_run_as_written(tmp_path):
    """The docs' commands that take seconds run as written."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for argv in (
        ["config"],
        ["config", "--format", "json"],
        ["info"],
        ["sweep", "--out", str(tmp_path / "s"), "--grid", "run.stability=adaptive,off",
         "--seeds", "0", "1", "--dry-run"],
    ):  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "trimtab", *argv], capture_output=True, text=True, env=env
        )
        assert proc.returncode == 0, (argv, proc.stderr[-2000:])
        assert proc.stdout.strip(), argv


@pytest.mark.slow
def test_run_directory_commands_run_as_written(report_warned, tmp_path):
    """The guides' ``trimtab report RUN_DIR`` and ``trimtab eval RUN_DIR --data ...`` lines,
    on a finished run, with its directory and data folder put in for the placeholders; and the
    docs page's ``python docs/gen_pages.py --out ...``."""
    run = report_warned.parent
    prices = run.parent / "prices"
    swap = {"runs/RUN_DIR": str(run), "other_prices/": str(prices), "prices/": str(prices)}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    ran = set()
    for path, argv in _commands():
        if argv[0] not in ("eval", "report") or "--resume" in argv:
            continue
        argv = [swap.get(a, a) for a in argv]
        proc = subprocess.run([sys.executable, "-m", "trimtab", *argv], capture_output=True,
                              text=True, env=env, timeout=300)  # fmt: skip
        assert proc.returncode == 0, (path.name, argv, proc.stderr[-2000:])
        ran.add(argv[0])
    assert ran == {"eval", "report"}
    line = next(ln for _, code in _blocks("bash") for ln in code.splitlines()
                if ln.startswith("python docs/gen_pages.py"))  # fmt: skip
    argv = line.split("#")[0].split()[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "pages")
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "pages/reference/config.md").is_file()
    assert (tmp_path / "pages/results/trading.md").is_file()
