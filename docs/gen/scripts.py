"""Which benchmark script wrote which results file, and the command that reproduces it, read from
the script's own docstring."""

from __future__ import annotations

import re
from pathlib import Path

from gen import ROOT

#: results file (its stem, or a prefix of it) -> the benchmark script that writes it
SCRIPTS: dict[str, str] = {
    "test_suite": "test_suite",
    "agent_vs_baselines": "agent_vs_baselines",
    "bsuite": "bsuite_suite",
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
    "population": "population",
    "probe_signal": "probe_signal",
    "probe_cpu_paths": "probe_cpu_paths",
    "probe_cartpole_ops": "probe_cartpole_ops",
    "probe_compile_cpu": "probe_compile_cpu",  # before probe_compile: the first prefix wins
    "probe_compile": "probe_compile",
    "probe_histogram": "probe_histogram",
    "probe_warps": "probe_warps",
    "profile_cpu_step": "profile_cpu_step",
    "profile_graph": "profile_graph",
    "profile_member_step": "profile_member_step",
    "probe_graph_branches": "probe_graph_branches",
    "profile_host": "profile_step",
    "profile_loop": "profile_loop",
    "profile_step": "profile_step",
    "quantile": "bench_quantile",
    "scale": "scale",
    "sentinel_share": "bench_sentinel_share",
    "sentinel_block": "sweep_sentinel_block",
    "sentinel": "bench_sentinel",
    "stress": "stress",
    "support_loop": "support_loop",
    "sweep": "bench_sweep",
    "throughput": "bench_throughput",
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
