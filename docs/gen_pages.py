"""The docs site's generated pages: the results (from ``benchmarks/results/*.json``), the config
reference (from ``trimtab.rl.config_reference``) and the API reference (from the public names).

    python docs/gen_pages.py --out /tmp/pages      # write them to a folder, to read or diff
    mkdocs build --strict                          # the same pages, through docs/hooks.py

One source of truth: nothing here holds a figure. Every number on a results page is read from the
JSON file the benchmark wrote, beside that record's machine, date and commit, and the command that
reproduces it is read from the benchmark script's own docstring.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# the site documents this checkout, whatever else is installed
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

#: Provenance fields of a benchmark record (trimtab.benchmarking.provenance), shown, not tabled.
PROVENANCE = ("machine", "device_name", "device", "date", "commit", "python", "torch", "triton")


# ----------------------------------------------------------------------------------------------
# loading


def load_json(path: Path) -> Any:
    """A results file: standard JSON, where a bare ``NaN``/``Infinity`` (Python's ``json.dump``
    default) reads as a float and ``null`` as None; both render as "n/a"."""
    return json.loads(
        path.read_text(), parse_constant=lambda c: float(c.replace("Infinity", "inf"))
    )


def records(data: Any) -> list[tuple[str, dict]]:
    """``(key, record)`` pairs of a results file: one record written whole (it has provenance at
    its top), or a dict of records keyed by ``--key``."""
    if not isinstance(data, dict):
        return [("", {"value": data})]
    if any(k in data for k in ("date", "commit", "benchmark", "rows")):
        return [("", data)]
    out = [(k, v) for k, v in data.items() if isinstance(v, dict)]
    return out or [("", data)]


# ----------------------------------------------------------------------------------------------
# formatting


def fmt(v: Any) -> str:
    """A cell: floats to 4 significant digits, NaN/None as n/a, lists of scalars joined."""
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        if math.isinf(v):
            return "∞" if v > 0 else "−∞"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.4g}"
    if isinstance(v, list):
        if len(v) <= 6 and all(not isinstance(x, (dict, list)) for x in v):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return f"({len(v)} values)"
    if isinstance(v, dict):
        return f"({len(v)} fields)"
    s = str(v).replace("|", "\\|").replace("\n", " ")
    return s if len(s) <= 120 else s[:117] + "…"


def signed(v: float | None, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:+.{digits}f}".replace("-", "−")


def table(header: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [
        "| " + " | ".join(c if isinstance(c, str) else fmt(c) for c in r) + " |" for r in rows
    ]
    return "\n".join(lines) + "\n"


def flat(d: dict, prefix: str = "", depth: int = 1) -> dict[str, Any]:
    """Scalar fields of ``d``, nested dicts flattened ``depth`` levels as ``a.b``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and depth > 0:
            out.update(flat(v, f"{prefix}{k}.", depth - 1))
        elif not isinstance(v, dict) and not (isinstance(v, list) and v and isinstance(v[0], dict)):
            out[f"{prefix}{k}"] = v
    return out


def provenance_line(rec: dict) -> str:
    parts = []
    machine = rec.get("device_name") or rec.get("device")
    if machine:
        parts.append(f"machine **{fmt(machine)}**")
    if rec.get("machine"):
        parts.append(f"host `{fmt(rec['machine'])}`")
    for k in ("date", "commit"):
        if rec.get(k):
            parts.append(f"{k} `{fmt(rec[k])}`")
    for k in ("torch", "triton", "python"):
        if rec.get(k):
            parts.append(f"{k} {fmt(rec[k])}")
    if not parts:
        return "*No provenance recorded in this record.*\n"
    return "Ran on " + ", ".join(parts) + ".\n"


def recorded_command(rec: dict) -> str | None:
    cmd = rec.get("command") or rec.get("how")
    if isinstance(cmd, list):
        cmd = " ".join(map(str, cmd))
    return cmd if isinstance(cmd, str) and cmd else None


# ----------------------------------------------------------------------------------------------
# which script wrote which file, and the command that reproduces it


#: results file (its stem, or a prefix of it) -> the benchmark script that writes it
SCRIPTS: dict[str, str] = {
    "test_suite": "test_suite",
    "agent_vs_baselines": "agent_vs_baselines",
    "capture_parity": "tests/rl/agent/test_learner_gpu.py",
    "capture_probe": "probe_capture",
    "cartpole_ablation": "cartpole",
    "cartpole_weight_headroom": "cartpole",
    "cartpole": "cartpole",
    "clamp_engagement": "clamp_engagement",
    "cleanrl": "bench_cleanrl",
    "ddp_cpu": "bench_ddp",
    "ddp_h200": "h200_ddp",
    "default_run_old_vs_new": "compare_default_runs",
    "default_run": "default_run",
    "ema_alarm": "bench_ema_alarm",
    "ema_bank": "bench_ema_bank",
    "ema": "bench_ema",
    "faults": "faults",
    "optim": "bench_optim",
    "probe_signal": "probe_signal",
    "probe_cpu_paths": "probe_cpu_paths",
    "probe_histogram": "probe_histogram",
    "probe_warps": "probe_warps",
    "profile_graph": "profile_graph",
    "profile_host": "profile_step",
    "profile_loop": "profile_loop",
    "profile_step": "profile_step",
    "quantile": "bench_quantile",
    "scale": "scale",
    "sentinel_share": "bench_sentinel_share",
    "sentinel": "bench_sentinel",
    "stress": "stress",
    "support_loop": "support_loop",
    "sweep": "bench_sweep",
    "trainer": "bench_trainer",
}


def script_for(stem: str) -> Path | None:
    """The script behind a results file, found by name anywhere under benchmarks/ (so the
    benchmarks can be moved into subfolders without touching this table)."""
    name = next((v for k, v in SCRIPTS.items() if stem == k or stem.startswith(k + "_")), None)
    if name is None:
        return None
    if "/" in name:
        return ROOT / name
    hits = sorted((ROOT / "benchmarks").rglob(f"{name}.py")) or sorted(
        (ROOT / "benchmarks").rglob(f"{name}.sh")
    )
    return hits[0] if hits else None


_USAGE = re.compile(r"^\s+((?:TRIMTAB_\w+=\S+ )*(?:python|bash|torchrun) .*)$")


def reproduce_command(script: Path | None) -> str:
    """The first usage line of the script's docstring (or leading comment), with its
    continuation lines; the bare invocation where the script gives none."""
    if script is None:
        return "(no script recorded for this file)"
    rel = script.relative_to(ROOT).as_posix()
    if rel.startswith("tests/"):
        return f"python -m pytest -q {rel}"
    text = script.read_text()
    lines = text.splitlines()[:80]
    for i, line in enumerate(lines):
        m = _USAGE.match(line.lstrip("#").rstrip() if line.startswith("#") else line)
        if m and (rel in line or script.name in line):
            cmd = [m.group(1).rstrip()]
            j = i
            while cmd[-1].endswith("\\") and j + 1 < len(lines):
                j += 1
                cmd[-1] = cmd[-1].rstrip("\\").rstrip() + " \\"
                cmd.append("    " + lines[j].lstrip("# ").strip())
            out = "\n".join(cmd).replace("\\\\", "\\")
            out = re.sub(r"\s+#.*$", "", out, flags=re.M)
            return out.replace(f"benchmarks/{script.name}", rel)
    runner = "bash" if script.suffix == ".sh" else "python"
    return f"{runner} {rel}"


# ----------------------------------------------------------------------------------------------
# generic rendering of a record


def list_tables(rec: dict, max_rows: int = 40) -> list[tuple[str, list[dict]]]:
    """The record's lists of row dicts, found up to two levels down: ``(where, rows)``."""
    found: list[tuple[str, list[dict]]] = []

    def walk(d: dict, where: str, depth: int) -> None:
        for k, v in d.items():
            if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                found.append((f"{where}{k}", v))
            elif isinstance(v, dict) and depth > 0:
                walk(v, f"{where}{k}.", depth - 1)

    walk(rec, "", 2)
    return found


def rows_table(rows: list[dict], max_rows: int = 40, max_cols: int = 12) -> str:
    flats = [flat(r, depth=1) for r in rows]
    cols: list[str] = []
    for f in flats:
        for k in f:
            if k not in cols and k not in PROVENANCE:
                cols.append(k)
    dropped = cols[max_cols:]
    cols = cols[:max_cols]
    body = [[f.get(c, "") for c in cols] for f in flats[:max_rows]]
    out = table([f"`{c}`" for c in cols], body)
    notes = []
    if len(rows) > max_rows:
        notes.append(f"{len(rows) - max_rows} more rows")
    if dropped:
        notes.append("more columns: " + ", ".join(f"`{c}`" for c in dropped[:12]))
    if notes:
        out += "\n*In the JSON: " + "; ".join(notes) + ".*\n"
    return out


#: a table of more rows than this is folded (a click opens it), so a page reads summary first
OPEN_ROWS = 8


def generic_record(rec: dict) -> str:
    out = []
    skip = (*PROVENANCE, "command", "how")
    scalars = {
        k: v
        for k, v in flat(rec, depth=1).items()
        if k not in skip and not (isinstance(v, list) and len(v) > 6)
    }
    if scalars:
        items = list(scalars.items())
        out.append(table(["field", "value"], [[f"`{k}`", v] for k, v in items[:30]]))
        if len(items) > 30:
            out.append(f"\n*{len(items) - 30} more fields in the JSON.*\n")
    for where, rows in list_tables(rec)[:6]:
        if len(rows) > OPEN_ROWS:
            # the summary above reads first; the raw rows open on a click
            out.append(f'\n??? info "`{where}`: {len(rows)} rows"\n\n' + indent(rows_table(rows)))
        else:
            out.append(f"\n`{where}`:\n\n" + rows_table(rows))
    return "\n".join(out)


def stress_record(rec: dict) -> str:
    """A stress file: per stability mode and market, how many runs kept every fold finite and
    how many the sentinel halted (what did not fail), then the rows."""
    cells: dict[tuple[str, str], list[dict]] = {}
    for r in rec.get("rows", []):
        cells.setdefault((str(r.get("stability")), str(r.get("market"))), []).append(r)
    body = []
    for (mode, market), rows in cells.items():
        total = sum(int(r.get("folds_total") or 0) for r in rows)
        finite = sum(int(r.get("folds_finite") or 0) for r in rows)
        halted = sum(1 for r in rows if r.get("halted"))
        fires = sorted({str(r["first_fire"]) for r in rows if r.get("first_fire")})
        body.append(
            [f"`{mode}`", market, str(len(rows)), f"{finite} of {total}", str(halted),
             ", ".join(fires[:3]) or "none"]
        )  # fmt: skip
    out = table(["stability", "market", "runs", "folds finite", "runs halted", "first fire"], body)
    return out + "\n" + generic_record(rec)


RENDERERS: dict[str, Callable[[dict], str]] = {"stress": stress_record}


def file_section(path: Path, level: int = 2, render: Callable[[dict], str] | None = None) -> str:
    """One results file: its script and command, then each record with its provenance."""
    data = load_json(path)
    script = script_for(path.stem)
    if render is None:
        render = next((f for k, f in RENDERERS.items() if path.stem.split("_")[0] == k), None)
    h = "#" * level
    out = [f"{h} `{path.name}`\n"]
    if script is not None:
        out.append(f"Written by `{script.relative_to(ROOT).as_posix()}`. Reproduce with:\n")
    out.append("```bash\n" + reproduce_command(script) + "\n```\n")
    recs = records(data)
    for key, rec in recs:
        if key:
            out.append(f'??? note "record `{key}`"\n')
            body = [provenance_line(rec)]
            cmd = recorded_command(rec)
            if cmd:
                body.append(f"Recorded command: `{fmt(cmd)}`\n")
            body.append((render or generic_record)(rec))
            out.append(indent("\n".join(body)))
        else:
            out.append(provenance_line(rec))
            cmd = recorded_command(rec)
            if cmd:
                out.append(f"Recorded command: `{fmt(cmd)}`\n")
            out.append((render or generic_record)(rec))
    return "\n".join(out) + "\n"


def indent(text: str) -> str:
    return "\n".join(("    " + line) if line.strip() else "" for line in text.splitlines()) + "\n"


# ----------------------------------------------------------------------------------------------
# plots


def png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ----------------------------------------------------------------------------------------------
# the trading page: the product's main claim

BASELINES = ("buy_and_hold", "momentum", "reversal", "ma_crossover", "random", "oracle")
LABELS = {
    "buy_and_hold": "buy & hold",
    "momentum": "momentum",
    "reversal": "reversal",
    "ma_crossover": "MA crossover",
    "random": "random (turnover-matched)",
    "oracle": "oracle (knows the regime)",
}


def default_runs(data: dict) -> list[tuple[str, dict, dict]]:
    """``(key, record, default variant)`` of every full (not ``--quick``) run of the default
    config, oldest first: the trading page's verdicts."""
    out = []
    for key, rec in records(data):
        var = rec.get("variants", {}).get("default")
        if var is not None and "aggregate" in var and not rec.get("quick"):
            out.append((key, rec, var))
    if not out:
        raise ValueError("agent_vs_baselines.json holds no full run of the default variant")
    return sorted(out, key=lambda t: str(t[1].get("date", "")))


def seeds_label(rec: dict, var: dict) -> str:
    seeds = rec.get("seeds") or [r.get("seed") for r in var.get("rows", [])]
    if seeds and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))


def mean_se(agg: dict, name: str) -> tuple[float, float]:
    m = agg.get(name) or {}
    return float(m.get("mean", float("nan"))), float(m.get("se", float("nan")))


def verdict(var: dict) -> str:
    """The page's claim, read from the aggregate: does the agent beat buy & hold and every simple
    baseline, and what fraction of the oracle's Sharpe does it reach."""
    agg = var["aggregate"]
    n = agg.get("seeds", len(var.get("rows", [])))
    a, a_se = mean_se(agg, "agent")
    bh, _ = mean_se(agg, "buy_and_hold")
    tgt = agg.get("targets", {})
    above = tgt.get("above", {})
    frac = tgt.get("oracle_fraction")
    beaten = [LABELS[k] for k, v in above.items() if v and k in LABELS]
    not_beaten = [LABELS[k] for k, v in above.items() if not v and k in LABELS]
    s = [
        f"Over {n} seeds the agent's pooled out-of-sample Sharpe is **{signed(a)} ± {a_se:.2f}** "
        f"(mean ± standard error) against **{signed(bh)}** for buy & hold."
    ]
    if not above.get("buy_and_hold", a > bh):
        s.append("**The agent does not beat buy & hold.**")
    else:
        s.append("The agent's mean is above buy & hold's.")
    if beaten:
        s.append("Its mean is above " + ", ".join(beaten) + ".")
    if not_beaten:
        s.append("It is not above " + ", ".join(not_beaten) + ".")
    vs = tgt.get("vs_best_positive_seeds")
    if vs is not None:
        s.append(
            "Its paired daily difference against the best simple baseline is positive in "
            f"{vs} seeds."
        )
    if frac is not None:
        s.append(f"Its mean is **{100 * frac:.0f}%** of the regime oracle's Sharpe (the ceiling).")
    return " ".join(s)


def trading_plot(var: dict) -> bytes:
    plt = _plt()
    rows = var["rows"]
    agg = var["aggregate"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    names = ["agent", *BASELINES]
    for i, name in enumerate(names):
        vals = [r.get(name) for r in rows if r.get(name) is not None]
        m, se = mean_se(agg, name)
        color = "tab:blue" if name == "agent" else ("tab:green" if name == "oracle" else "0.55")
        ax.bar(i, m, yerr=se if se == se else 0, color=color, alpha=0.75, capsize=4)
        ax.scatter([i] * len(vals), vals, color="k", s=10, zorder=3)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(["agent"] + [LABELS[b].split(" (")[0] for b in BASELINES], rotation=20)
    ax.set_ylabel("pooled out-of-sample Sharpe")
    ax.set_title(f"Default run, {agg.get('seeds', len(rows))} seeds (dots), mean ± s.e. (bars)")
    return png(fig)


#: what the benchmark's docstring says of its seeds: settings are chosen on 0-4, 5-9 are held out
HELD_OUT = frozenset(range(5, 10))


def trading_page() -> tuple[str, dict[str, bytes]]:
    path = RESULTS / "agent_vs_baselines.json"
    data = load_json(path)
    runs = default_runs(data)
    script = script_for(path.stem)
    out = [
        "# Trading: the agent against the baselines\n",
        "This page is generated from `benchmarks/results/agent_vs_baselines.json`. It is the "
        "product's main claim, so it leads with the verdict: the default `trimtab train` run "
        "(next-open fills, about 5 bp per unit of turnover, borrow and cash rate; the embedded "
        "market), one process per seed, the pooled out-of-sample Sharpe of the agent and of "
        "every baseline on the same days, fills and costs. Settings were chosen on seeds 0-4; "
        "seeds 5-9 are held out.\n",
        "Reproduce with:\n",
        "```bash\n" + reproduce_command(script) + "\n```\n",
        "## Verdict\n",
    ]
    images: dict[str, bytes] = {}
    details = []
    # today's default first; a record marked "superseded" ran an earlier default
    current = [r for r in runs if not r[1].get("superseded")]
    earlier = [r for r in runs if r[1].get("superseded")]
    for i, (key, rec, var) in enumerate(current + earlier):
        if i == len(current) and earlier:
            out.append("### Earlier defaults\n")
        seeds = set(rec.get("seeds") or [])
        tag = " (held out)" if seeds and seeds <= HELD_OUT else ""
        machine = fmt(rec.get("device_name") or rec.get("device") or "n/a")
        ran = f"; it ran {rec['superseded']}" if rec.get("superseded") else ""
        out.append(
            f"**{seeds_label(rec, var)}{tag}, {machine}** (record `{key}`{ran}). " + verdict(var)
        )
        out.append("")
        rows = var["rows"]
        days = rows[0].get("days") if rows else None
        details.append(f"## {seeds_label(rec, var)}{tag}: record `{key}`\n")
        details.append(
            f"Pooled Sharpe over {fmt(days)} out-of-sample days. " + provenance_line(rec)
        )
        images[f"agent_vs_baselines_{key}.png"] = trading_plot(var)
        details.append(
            f"![Pooled out-of-sample Sharpe, record {key}](agent_vs_baselines_{key}.png)\n"
        )
        details.append(seed_table(var))
    out += details
    return _variants("\n".join(out), data), images


def seed_table(var: dict) -> str:
    header = (
        ["seed", "agent [95% interval]"]
        + [LABELS[b].split(" (")[0] for b in BASELINES]
        + ["agent − best simple (IR)"]
    )
    body = []
    for r in var["rows"]:
        ci = r.get("agent_ci95") or [None, None]
        body.append(
            [str(r.get("seed")), f"{signed(r.get('agent'))} [{signed(ci[0])}, {signed(ci[1])}]"]
            + [signed(r.get(b)) for b in BASELINES]
            + [signed(r.get("vs_best_ir"))]
        )
    agg = var["aggregate"]
    m, se = mean_se(agg, "agent")
    vm, vse = mean_se(agg, "vs_best_ir")
    body.append(
        ["mean ± s.e.", f"**{signed(m)} ± {se:.2f}**"]
        + [signed(mean_se(agg, b)[0]) for b in BASELINES]
        + [f"{signed(vm)} ± {vse:.2f}"]
    )
    return table(header, body)


def _variants(text: str, data: dict) -> str:
    out = [text]
    out.append("\n## Variants tried\n")
    out.append(
        "Each row is a variant (a set of `--set` overrides of the default) over the seeds shown, "
        "on the same market, fills and costs.\n"
    )
    vbody = []
    for k, r in records(data):
        for name, v in r.get("variants", {}).items():
            if "aggregate" not in v:
                continue
            a = v["aggregate"]
            m, se = mean_se(a, "agent")
            frac = a.get("targets", {}).get("oracle_fraction")
            vbody.append(
                [
                    f"`{k}`",
                    f"`{name}`",
                    ", ".join(f"`{o}`" for o in v.get("overrides", [])) or "(default)",
                    seeds_label(r, v),
                    f"{signed(m)} ± {se:.2f}",
                    signed(mean_se(a, "buy_and_hold")[0]),
                    "n/a" if frac is None else f"{100 * frac:.0f}%",
                    fmt(r.get("date")),
                ]
            )
    out.append(
        table(
            ["record", "variant", "overrides", "seeds", "agent", "buy & hold", "of oracle", "date"],
            vbody,
        )
    )
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# the results pages

#: page -> (title, intro, results file stems in order); every results file sits on one page
PAGES: dict[str, tuple[str, str, list[str]]] = {
    "probes": (
        "What the features expose",
        "Supervised probes (ridge regressions, a small MLP) fitted on each training window and "
        "traded out of sample with the trainer's fills and costs: how much of the oracle's "
        "Sharpe the agent's features allow, beside what the agent reaches.",
        ["probe_signal"],
    ),
    "default-run": (
        "The default run on a GPU",
        "Wall time and fold tables of the default `trimtab train` on an H200, and the older "
        "comparison of the trainer before and after its rewrite.",
        ["default_run_h200", "default_run_old_vs_new_h200"],
    ),
    "cartpole": (
        "CartPole-v1 and CleanRL",
        "`examples/cartpole.toml` (CleanRL's `c51.py` settings) and the comparison with "
        "CleanRL's own script on the same machine.",
        [
            "cartpole",
            "cartpole_h200",
            "cartpole_ablation",
            "cartpole_weight_headroom",
            "cleanrl_cpu",
        ],
    ),
    "stability": (
        "Stability: stress, faults, clamps, reward scale",
        "What fails and what does not, per stability mode; how often each clamp binds; the "
        "support's closed loop; runs across reward scales.",
        [
            "stress",
            "stress_bf16",
            "stress_fp16",
            "stress_reward100",
            "stress_mlp_reward100",
            "stress_mlp_reward100_fp16",
            "faults",
            "clamp_engagement",
            "scale",
            "support_loop",
            "support_loop_R_floor_1e-6",
            "support_loop_estimator_only",
            "support_loop_reward0.001",
            "support_loop_reward1000",
        ],
    ),
    "speed": (
        "Speed: trainer, CUDA graphs, several processes",
        "Step times and throughput of the trainer on the CPU and the H200, the captured step's "
        "parity, profiles, DDP and Ray sweeps; the time of the whole test suite.",
        [
            "trainer_cpu",
            "trainer_h200",
            "trainer_h200_contended",
            "profile_step_cpu",
            "profile_step_h200",
            "profile_host_h200",
            "profile_loop_h200",
            "profile_graph_h200",
            "capture_parity_h200",
            "capture_probe_h200",
            "probe_warps_h200",
            "probe_histogram_h200",
            "probe_cpu_paths",
            "ddp_cpu",
            "ddp_h200_1gpu",
            "sweep_h200",
            "test_suite",
        ],
    ),
    "kernels": (
        "Library kernels: EMA, quantiles, sentinel, optimizer",
        "Each kernel against its PyTorch reference (bytes moved, GB/s), and the estimator's "
        "behaviour on banks of signals.",
        ["ema", "ema_bank", "ema_alarm", "quantile", "sentinel", "sentinel_share", "optim"],
    ),
}

#: files on the trading page
TRADING = ["agent_vs_baselines"]


def result_pages() -> dict[str, str | bytes]:
    files = {p.stem: p for p in sorted(RESULTS.glob("*.json"))}
    placed = set(TRADING) | {s for _, _, stems in PAGES.values() for s in stems}
    unplaced = sorted(set(files) - placed)
    pages: dict[str, str | bytes] = {}
    text, images = trading_page()
    pages["results/trading.md"] = text
    for name, data in images.items():
        pages[f"results/{name}"] = data
    # every png the benchmarks wrote beside their JSON (e.g. scale.py's plots)
    for p in sorted(RESULTS.glob("*.png")):
        pages[f"results/{p.name}"] = p.read_bytes()
    pngs = {p.stem: p.name for p in RESULTS.glob("*.png")}
    stems_pages = dict(PAGES)
    if unplaced:
        stems_pages["other"] = (
            "Other results",
            "Results files not yet placed on a page.",
            unplaced,
        )
    index = [
        "# Results\n",
        "Every page here is generated by `docs/gen_pages.py` from `benchmarks/results/*.json`: "
        "tables (and plots where they help), each with the command that reproduces it and the "
        "machine, date and commit recorded in the JSON. A figure that is not in a results file is "
        "not on these pages.\n",
        "- [Trading: the agent against the baselines](trading.md): the main claim.",
    ]
    for name, (title, intro, stems) in stems_pages.items():
        present = [s for s in stems if s in files]
        if not present:
            continue
        index.append(f"- [{title}]({name}.md): {intro}")
        out = [
            f"# {title}\n",
            intro + "\n",
            "Generated from " + ", ".join(f"`{s}.json`" for s in present) + ".\n",
        ]
        for stem in present:
            out.append(file_section(files[stem]))
            for plot_stem, plot in sorted(pngs.items()):
                if plot_stem.startswith(stem + "_"):
                    out.append(f"![{plot_stem}]({plot})\n")
        pages[f"results/{name}.md"] = "\n".join(out)
    index.append("\n## Files\n")
    rows = []
    for stem, p in files.items():
        data = load_json(p)
        recs = records(data)
        page = (
            "trading"
            if stem in TRADING
            else next((n for n, (_, _, s) in stems_pages.items() if stem in s), "other")
        )
        dates = sorted(str(r.get("date", ""))[:10] for _, r in recs if r.get("date"))
        machines = sorted(
            {fmt(r.get("device_name") or r.get("device") or "") for _, r in recs} - {""}
        )
        rows.append(
            [
                f"[`{p.name}`]({page}.md)",
                str(len(recs)),
                ", ".join(machines[:3]) or "n/a",
                (dates[0] if dates else "n/a") + (f" … {dates[-1]}" if len(dates) > 1 else ""),
            ]
        )
    index.append(table(["file", "records", "machine", "date"], rows))
    pages["results/index.md"] = "\n".join(index)
    return pages


# ----------------------------------------------------------------------------------------------
# the config reference


def config_reference_page() -> str:
    """The config reference, from ``trimtab.rl.config_reference.reference(device)``."""
    try:
        mod = importlib.import_module("trimtab.rl.config_reference")
        reference = mod.reference
    except (ImportError, AttributeError) as e:
        raise RuntimeError(
            "docs: the config reference page is generated from "
            "trimtab.rl.config_reference.reference(device) -> list[dict] "
            f"(one dict per key: key, type, default, device_default, meaning, allowed), which is "
            f"missing here ({e}). Install the package from this checkout (pip install -e .[docs])."
        ) from e
    cpu = reference("cpu")
    cuda = {r["key"]: r for r in reference("cuda")}
    sections: dict[str, list[dict]] = {}
    for r in cpu:
        sections.setdefault(r["key"].split(".", 1)[0], []).append(r)
    out = [
        "# Config reference\n",
        "Generated from the trainer's config dataclasses (`trimtab.rl.config_reference`); the "
        "same table prints with `trimtab config` (`--format markdown|json`, `--device cuda`). "
        "Set a key in a TOML file (`--config FILE`, one `[section]` per prefix) or on the "
        "command line (`--set section.key=value`). A key whose default depends on the device "
        "shows both values. Every run writes its resolved config to `RUN_DIR/config.toml`.\n",
    ]
    for section, rows in sections.items():
        out.append(f"## `[{section}]`\n")
        body = []
        for r in rows:
            d = r.get("default")
            dev = cuda.get(r["key"], {}).get("device_default", d)
            cpu_dev = r.get("device_default", d)
            default = f"`{_toml(cpu_dev)}`"
            if dev != cpu_dev:
                default = f"CPU `{_toml(cpu_dev)}`, CUDA `{_toml(dev)}`"
            if d != cpu_dev and d != dev:
                default = f"`{_toml(d)}` → " + default
            body.append(
                [
                    f"`{r['key']}`",
                    _type(r),
                    default,
                    _cell(r.get("meaning") or ""),
                    _allowed(r.get("allowed")),
                ]
            )
        out.append(table(["key", "type", "default", "meaning", "allowed"], body))
    return "\n".join(out)


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if v is None:
        return "none"
    return str(v)


def _type(r: dict) -> str:
    """The type, or "one of" where the allowed values already list a choice of literals."""
    t, allowed = str(r.get("type", "")), r.get("allowed")
    if (
        isinstance(allowed, (list, tuple))
        and allowed
        and all(_toml(a) in t for a in allowed)
        and "|" in t
        and "int" not in t
        and "float" not in t
    ):
        return "one of"
    return f"`{t}`".replace("|", "\\|")


def _allowed(v: Any) -> str:
    if v is None or v == "" or v == []:
        return ""
    if isinstance(v, (list, tuple)):
        return ", ".join(f"`{_toml(x)}`" for x in v)
    return _cell(v)


#: how the code's comments cite a docs page: ``docs: guides/stability.md#where-a-clamp-binds``
_DOCS_REF = re.compile(r"docs: ([a-z-]+/[a-z0-9-]+\.md(?:#[a-z0-9-]+)?)")


def _cell(s: Any) -> str:
    """A table cell of prose: no raw HTML (``<time>`` is text), pipes escaped, and the
    docs pages the comments cite made links."""
    import html

    text = html.escape(str(s), quote=False).replace("|", "\\|").replace("\n", " ")
    return _DOCS_REF.sub(lambda m: f"[{m.group(1)}](../{m.group(1)})", text)


# ----------------------------------------------------------------------------------------------
# the API reference

#: page -> (title, what it holds, [(public name, fallbacks "module:attr" while the layout moves)])
API: dict[str, tuple[str, str, list[tuple[str, list[str]]]]] = {
    "library": (
        "`trimtab`: the library",
        "The library for any PyTorch loop. `import trimtab` needs only torch and numpy; Triton "
        "kernels (`trimtab.kernels`, leaves) load on first use on a CUDA tensor.",
        [
            ("trimtab.guard:Guard", []),
            ("trimtab.guard:GuardParts", []),
            ("trimtab.guard:SentinelChecks", []),
            ("trimtab.bounds:AdaptiveBounds", []),
            ("trimtab.bounds:BoundClamp", []),
            ("trimtab.clamp:clamp_finite_", []),
            ("trimtab.clamp:guard_", []),
            ("trimtab.clamp:scale_finite_", []),
            ("trimtab.clip:AdaptiveGradClip", []),
            ("trimtab.sentinel:Sentinel", []),
            ("trimtab.sentinel:Rule", []),
            ("trimtab.sentinel:NonFiniteError", []),
            ("trimtab.nonfinite:NonFinitePolicy", []),
            ("trimtab.state:StateVector", []),
            ("trimtab.state:Slot", []),
            ("trimtab.state:LayoutMismatchError", []),
            ("trimtab.estimate:AdaptiveEMA", []),
            ("trimtab.quantile:abs_quantile", []),
            ("trimtab.quantile:abs_quantiles", []),
            ("trimtab.engagement:EngagementCorrection", []),
            ("trimtab.lifecycle:Lifecycle", []),
            ("trimtab.distributed:RankConsistent", []),
            ("trimtab.optim:Adam", []),
        ],
    ),
    "config": (
        "`trimtab.rl.config`, `trimtab.rl.configio`",
        "The trainer's one frozen config and its TOML input and output. Every key is listed in "
        "the [config reference](../config.md).",
        [
            ("trimtab.rl.config:TrainConfig", []),
            ("trimtab.rl.config:RunConfig", []),
            ("trimtab.rl.config:EnvConfig", []),
            ("trimtab.rl.config:DataConfig", []),
            ("trimtab.rl.config:WalkForwardConfig", []),
            ("trimtab.rl.config:BacktestConfig", []),
            ("trimtab.rl.config:GymConfig", []),
            ("trimtab.rl.configio:load_toml", []),
            ("trimtab.rl.configio:from_dict", []),
            ("trimtab.rl.configio:apply_overrides", []),
            ("trimtab.rl.configio:to_toml", []),
            ("trimtab.rl.configio:ConfigError", []),
        ],
    ),
    "data": (
        "`trimtab.rl.data`",
        "Loading CSV and Parquet market files, calendars and time zones, data checks and "
        "warnings, the synthetic market, features.",
        [
            ("trimtab.rl.data:load_ohlcv", []),
            ("trimtab.rl.data:MarketData", []),
            ("trimtab.rl.data:DataError", ["trimtab.rl.data_issues:DataError"]),
            ("trimtab.rl.data:DataIssue", ["trimtab.rl.data_issues:DataIssue"]),
            ("trimtab.rl.data:periods_per_year", ["trimtab.rl.calendar:periods_per_year"]),
            ("trimtab.rl.data:parse_dates", ["trimtab.rl.calendar:parse_dates"]),
            ("trimtab.rl.data:MarketSpec", ["trimtab.rl.market:MarketSpec"]),
            ("trimtab.rl.data:simulate", ["trimtab.rl.market:simulate"]),
            ("trimtab.rl.data:compute_features", ["trimtab.rl.features:compute_features"]),
            ("trimtab.rl.data:FeatureNormalizer", ["trimtab.rl.features:FeatureNormalizer"]),
        ],
    ),
    "envs": (
        "`trimtab.rl.envs`",
        "The market environment, the Gymnasium and torch CartPole adapters, the env registry, "
        "env state as data.",
        [
            ("trimtab.rl.envs:BatchedTradingEnv", ["trimtab.rl.env:BatchedTradingEnv"]),
            ("trimtab.rl.envs:TradingGymEnv", ["trimtab.rl.env:TradingGymEnv"]),
            ("trimtab.rl.envs:BatchedCartPole", ["trimtab.rl.cartpole:BatchedCartPole"]),
            ("trimtab.rl.envs:make_adapter", ["trimtab.rl.adapters:make_adapter"]),
            ("trimtab.rl.envs:MarketAdapter", ["trimtab.rl.adapters:MarketAdapter"]),
            ("trimtab.rl.envs:GymAdapter", ["trimtab.rl.adapters:GymAdapter"]),
            ("trimtab.rl.envs:TorchCartPoleAdapter", ["trimtab.rl.adapters:TorchCartPoleAdapter"]),
            ("trimtab.rl.envs:env_state", ["trimtab.rl.gym_state:env_state"]),
            ("trimtab.rl.envs:restore_env", ["trimtab.rl.gym_state:restore_env"]),
        ],
    ),
    "agent": (
        "`trimtab.rl.agent`",
        "The agent and its config, the networks, the losses, the replay, the learner with its "
        "stability wiring, and the captured CUDA-graph step.",
        [
            ("trimtab.rl.agent:Agent", ["trimtab.rl.agent:DQNAgent"]),
            ("trimtab.rl.agent:AgentConfig", []),
            ("trimtab.rl.agent:BranchingQNetwork", ["trimtab.rl.networks:BranchingQNetwork"]),
            ("trimtab.rl.agent:c51_projection", ["trimtab.rl.losses:c51_projection"]),
            ("trimtab.rl.agent:c51_loss", ["trimtab.rl.losses:c51_loss"]),
            ("trimtab.rl.agent:quantile_huber_loss", ["trimtab.rl.losses:quantile_huber_loss"]),
            ("trimtab.rl.agent:n_step_returns", ["trimtab.rl.losses:n_step_returns"]),
            ("trimtab.rl.agent:ReplayBuffer", ["trimtab.rl.replay:ReplayBuffer"]),
            ("trimtab.rl.agent:Learner", ["trimtab.rl.learner:Learner"]),
            ("trimtab.rl.agent:build_learner", ["trimtab.rl.learner:build_learner"]),
            ("trimtab.rl.agent:build_stability", ["trimtab.rl.stability:build_stability"]),
            ("trimtab.rl.agent:CapturedStep", ["trimtab.rl.graphed:CapturedStep"]),
        ],
    ),
    "backtest": (
        "`trimtab.rl.backtest`",
        "Execution and costs, the baselines, the pooled out-of-sample statistics with their "
        "intervals, selection over many trials.",
        [
            ("trimtab.rl.backtest:Fills", ["trimtab.rl.backtest.execution:Fills"]),
            ("trimtab.rl.backtest:Costs", ["trimtab.rl.backtest.execution:Costs"]),
            ("trimtab.rl.backtest:fill_returns", ["trimtab.rl.backtest.execution:fill_returns"]),
            ("trimtab.rl.backtest:simulate", ["trimtab.rl.backtest.baselines:simulate"]),
            ("trimtab.rl.backtest:buy_and_hold", ["trimtab.rl.backtest.baselines:buy_and_hold"]),
            ("trimtab.rl.backtest:random_levels", ["trimtab.rl.backtest.baselines:random_levels"]),
            ("trimtab.rl.backtest:oracle_levels", ["trimtab.rl.backtest.baselines:oracle_levels"]),
            ("trimtab.rl.backtest:fold_backtest", ["trimtab.rl.backtest.pooled:fold_backtest"]),
            ("trimtab.rl.backtest:pool", ["trimtab.rl.backtest.pooled:pool"]),
            ("trimtab.rl.backtest:sharpe", ["trimtab.rl.backtest.stats:sharpe"]),
            ("trimtab.rl.backtest:sharpe_ci", ["trimtab.rl.backtest.stats:sharpe_ci"]),
            (
                "trimtab.rl.backtest:stationary_bootstrap",
                ["trimtab.rl.backtest.stats:stationary_bootstrap"],
            ),
            (
                "trimtab.rl.backtest:paired_difference",
                ["trimtab.rl.backtest.stats:paired_difference"],
            ),
            ("trimtab.rl.backtest:breakeven_bps", ["trimtab.rl.backtest.stats:breakeven_bps"]),
            ("trimtab.rl.backtest:max_drawdown", ["trimtab.rl.backtest.stats:max_drawdown"]),
            (
                "trimtab.rl.backtest:deflated_sharpe",
                ["trimtab.rl.backtest.selection:deflated_sharpe"],
            ),
        ],
    ),
    "run": (
        "`trimtab.rl.run`",
        "The runner, walk-forward folds, evaluation, checkpoints, the run directory, DDP, "
        "collection, and the `trimtab train` command.",
        [
            ("trimtab.rl.run:train", ["trimtab.rl.runner:train"]),
            ("trimtab.rl.run:make_folds", ["trimtab.rl.walkforward:make_folds"]),
            ("trimtab.rl.run:evaluate_fold", ["trimtab.rl.walkforward:evaluate_fold"]),
            ("trimtab.rl.run:evaluate_checkpoint", ["trimtab.rl.evaluate:evaluate_checkpoint"]),
            ("trimtab.rl.run:save", ["trimtab.rl.checkpoint:save"]),
            ("trimtab.rl.run:load", ["trimtab.rl.checkpoint:load"]),
            ("trimtab.rl.run:CheckpointError", ["trimtab.rl.checkpoint:CheckpointError"]),
            ("trimtab.rl.run:prepare_run_dir", ["trimtab.rl.rundir:prepare_run_dir"]),
            ("trimtab.rl.run:MetricsLog", ["trimtab.rl.rundir:MetricsLog"]),
            ("trimtab.rl.run:TrainingHalted", ["trimtab.rl.rundir:TrainingHalted"]),
            ("trimtab.rl.run:Collector", ["trimtab.rl.collect:Collector"]),
            ("trimtab.rl.run:Ranks", ["trimtab.rl.ddp:Ranks"]),
            ("trimtab.rl.run:AgentDDP", ["trimtab.rl.ddp:AgentDDP"]),
        ],
    ),
    "report": (
        "`trimtab.rl.report`",
        "The run's HTML report, its plots and its tables.",
        [
            ("trimtab.rl.report:build_report", []),
            ("trimtab.rl.report:market_figures", ["trimtab.rl.report_plots:market_figures"]),
            ("trimtab.rl.report:format_fold_table", ["trimtab.rl.report_tables:format_fold_table"]),
            ("trimtab.rl.report:verdict", ["trimtab.rl.report_tables:verdict"]),
        ],
    ),
    "sweep": (
        "`trimtab.rl.sweep`",
        "Sweeps as Ray tasks, the sweep spec, the sweep table, multi-seed runs.",
        [
            ("trimtab.rl.sweep:run_sweep", []),
            ("trimtab.rl.sweep:run_trial", []),
            ("trimtab.rl.sweep:SweepResult", []),
            ("trimtab.rl.sweep:SweepSpec", ["trimtab.rl.sweep_spec:SweepSpec"]),
            ("trimtab.rl.sweep:load_sweep_file", ["trimtab.rl.sweep_spec:load_sweep_file"]),
            ("trimtab.rl.sweep:format_table", ["trimtab.rl.sweep_table:format_table"]),
        ],
    ),
}


def _defined_at(obj: Any, mod_name: str, attr: str) -> str:
    return f"{getattr(obj, '__module__', mod_name)}.{getattr(obj, '__qualname__', attr)}"


def resolve(public: str, fallbacks: list[str]) -> tuple[str, str]:
    """``(public dotted name, where it is defined)`` of the first of ``public`` and
    ``fallbacks`` that imports, else of the same names defined in a submodule of the public
    name's package (the trainer's packages keep their objects in submodules). The definition's
    path is what mkdocstrings reads statically."""
    cands = [public, *fallbacks]
    for cand in cands:
        mod_name, attr = cand.split(":")
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        obj = getattr(mod, attr, None)
        if obj is not None and hasattr(obj, "__qualname__"):
            return public.replace(":", "."), _defined_at(obj, mod_name, attr)
    pkg_name = public.split(":")[0]
    try:
        pkg = importlib.import_module(pkg_name)
    except ImportError:
        pkg = None
    if pkg is not None and hasattr(pkg, "__path__"):
        import pkgutil

        names = [c.split(":")[1] for c in cands]
        for info in pkgutil.iter_modules(pkg.__path__, pkg_name + "."):
            sub = importlib.import_module(info.name)
            for attr in names:
                obj = getattr(sub, attr, None)
                if obj is not None and getattr(obj, "__module__", None) == info.name:
                    return f"{info.name}.{attr}", _defined_at(obj, info.name, attr)
    raise RuntimeError(
        f"docs: API reference: none of {cands} imports; update the API table in docs/gen_pages.py"
    )


def api_pages() -> dict[str, str]:
    pages: dict[str, str] = {}
    index = [
        "# API reference\n",
        "Generated from the docstrings of the public API (mkdocstrings). The library first, then "
        "the trainer's packages. Module docstrings say what each is for; a class's docstring "
        "gives its algorithm and its source.\n",
    ]
    for name, (title, what, entries) in API.items():
        index.append(f"- [{title}]({name}.md): {what}")
        out = [f"# {title}\n", what + "\n"]
        for public, fallbacks in entries:
            shown, where = resolve(public, fallbacks)
            short = shown.rsplit(".", 1)[1]
            out.append(f"## {short}\n")
            if where.rsplit(".", 1)[0] != shown.rsplit(".", 1)[0]:
                out.append(f"Defined in `{where.rsplit('.', 1)[0]}`.\n")
            out.append(f"::: {where}\n    options:\n      show_root_heading: false\n")
        pages[f"reference/api/{name}.md"] = "\n".join(out)
    pages["reference/api/index.md"] = "\n".join(index) + "\n"
    return pages


# ----------------------------------------------------------------------------------------------
# the command line


def cli_page() -> str:
    """Every ``trimtab`` command's ``--help``, from the parser itself."""
    import os

    from trimtab.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width
    parser = build_parser()
    out = [
        "# Commands\n",
        "Generated from the command line's own parser: each command's `--help`.\n",
        "```text\n" + parser.format_help().rstrip() + "\n```\n",
    ]
    for action in parser._subparsers._group_actions:  # argparse has no public walk
        for name, sub in action.choices.items():
            out.append(f"## `trimtab {name}`\n")
            out.append("```text\n" + sub.format_help().rstrip() + "\n```\n")
    out.append(
        "Several processes: `torchrun --nproc-per-node N -m trimtab train ...` "
        "([Several GPUs with torchrun](../guides/multi-gpu.md)).\n"
    )
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------


def pages(config_reference: bool = True) -> dict[str, str | bytes]:
    """Every generated page, by its path under docs/."""
    out: dict[str, str | bytes] = {}
    out.update(result_pages())
    out.update(api_pages())
    out["reference/cli.md"] = cli_page()
    if config_reference:
        out["reference/config.md"] = config_reference_page()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder to write the pages into")
    args = ap.parse_args(argv)
    for rel, content in pages().items():
        path = args.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
