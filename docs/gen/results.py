"""The results pages: which results file sits on which page, each page of file sections, and the
index with its table of files."""

from __future__ import annotations

from gen import RESULTS
from gen.markdown import fmt, table
from gen.records import load_json, records
from gen.sections import file_section
from gen.trading import trading_page

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
        "Wall time and fold tables of the default `trimtab train` on a GPU (an H200 or an H100: "
        "each record names its device), a machine's first run (`--cold`: an empty Triton "
        "cache) beside later ones, and the older comparison of the trainer before and after "
        "its rewrite.",
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
            "profile_cpu_step",
            "probe_compile_cpu",
        ],
    ),
    "stability": (
        "Stability: stress, faults, clamps, reward scale",
        "What fails and what does not, per stability mode; how often each clamp binds; the "
        "support's closed loop; runs across reward scales, on our grid and under bsuite's rules.",
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
            "bsuite",
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
            "probe_compile_h100",
            "profile_graph_h200",
            "profile_member_step",
            "probe_graph_branches_h100",
            "capture_parity_h200",
            "capture_probe_h200",
            "probe_warps_h200",
            "probe_histogram_h200",
            "probe_cpu_paths",
            "probe_cartpole_ops",
            "ddp_cpu",
            "ddp_h200_1gpu",
            "sweep_h200",
            "population_h200",
            "throughput_h200",
            "test_suite",
        ],
    ),
    "kernels": (
        "Library kernels: EMA, quantiles, sentinel, optimizer, env steps",
        "Each kernel against its PyTorch reference (bytes moved, GB/s), and the estimator's "
        "behaviour on banks of signals.",
        [
            "ema",
            "ema_bank",
            "ema_alarm",
            "quantile",
            "quantile_h100",
            "sentinel",
            "sentinel_share",
            "sentinel_block_h100",
            "optim",
            "optim_h100",
            "env_step",
        ],
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
