"""The trading page, the product's main claim: the verdict of each full run of the default
config against the baselines, its plot and seed table, and the variants tried."""

from __future__ import annotations

import io
from typing import Any

from gen import RESULTS
from gen.markdown import fmt, signed, table
from gen.records import load_json, provenance_line, records
from gen.scripts import reproduce_command, script_for


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
        cis = [r.get("vs_best_ir_ci95") for r in var.get("rows", [])]
        sure = sum(1 for ci in cis if ci and ci[0] is not None and ci[0] > 0)
        s.append(
            "Its paired daily difference against the best simple baseline is positive in "
            f"{vs} seeds; its 95% interval excludes zero in {sure} of {len(cis)}."
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
    markets = held_out_markets(data)
    if markets:
        out.append("### Held-out markets\n")
        out.append(
            "The default on other draws of the same market process (`data.market_seed`), on "
            "which nothing was chosen:\n"
        )
        for key, rec, var in markets:
            over = ", ".join(f"`{o}`" for o in var.get("overrides", []))
            out.append(f"**{seeds_label(rec, var)}, {over}** (record `{key}`). " + verdict(var))
            out.append("")
    out += details
    return _variants("\n".join(out), data), images


def held_out_markets(data: dict) -> list[tuple[str, dict, dict]]:
    """``(key, record, variant)`` of every full run whose only override is the market's seed:
    the default on another market."""
    out = []
    for key, rec in records(data):
        if rec.get("quick") or rec.get("superseded"):
            continue
        for var in rec.get("variants", {}).values():
            over = var.get("overrides", [])
            market = over and all(o.startswith("data.market_seed=") for o in over)
            if market and "aggregate" in var:
                out.append((key, rec, var))
    return out


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


VARIANT_HEADER = ["record", "variant", "overrides", "seeds", "agent", "buy & hold", "of oracle",
                  "commit", "date"]  # fmt: skip


def _variants(text: str, data: dict) -> str:
    out = [text]
    out.append("\n## Variants tried\n")
    out.append(
        "Each row is a variant (a set of `--set` overrides of the default of its commit: the "
        "defaults have changed between records, and each record's note says what it ran) over "
        "the seeds shown, on the same market, fills and costs.\n"
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
                    fmt(str(r.get("commit", "n/a"))[:7]),
                    fmt(r.get("date")),
                ]
            )
    out.append(table(VARIANT_HEADER, vbody))
    notes = [
        f"- `{k}`: {' '.join(str(r['note']).split())}" for k, r in records(data) if r.get("note")
    ]
    if notes:
        out += ["\nWhat each record ran, in its own words:\n", *notes, ""]
    return "\n".join(out)
