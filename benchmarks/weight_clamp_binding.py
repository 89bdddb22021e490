"""How often Adam's weight clamp binds, counted at every step of a run: the fraction of each
group's weights that a step left at the clamp (``|w| = run.weight_headroom × b``, ``b`` the
bound the step read), beside the fraction above the bound itself (what the engagement test
counts, whatever the headroom).

    python benchmarks/weight_clamp_binding.py [--config examples/cartpole.toml] \\
        [--headroom 1 2] [--seeds 1 2 3] [--set KEY=VALUE ...] [--out JSON] [--key NAME]

Each (headroom, seed) is one adaptive ``trimtab train`` run in this process (CPU, eager: the
count reads the bound before each step and the weights after it, a host read per step, which
the trainer itself never makes). Default: CartPole-v1 for 30k env steps (2,001 updates), the
span of README "Where a clamp binds". Groups: weight matrices, then vectors (biases).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from trimtab.benchmarking import (
    benchmark_parser,
    invocation,
    markdown_table,
    provenance,
    save_record,
)
from trimtab.optim import WEIGHT_BOUND_FLOOR
from trimtab.optim._reference import coefficients

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "clamp_engagement.json"


def counter(opt: Any, headroom: float, tally: dict[str, list[int]]) -> None:
    """Wrap ``opt.step`` (a :class:`trimtab.optim.Adam`): per group, add to ``tally`` the
    weights the step left at the clamp, those above the bound, and the weights stepped."""
    step = opt.step

    def counted(*args: Any, **kwargs: Any) -> Any:
        bounds = [float(coefficients(v, WEIGHT_BOUND_FLOOR)[2]) for v in opt._slot_views]
        out = step(*args, **kwargs)
        with torch.no_grad():
            for g, (group, b) in enumerate(zip(opt.param_groups, bounds)):
                if not group["weight_clamp"] or b == float("inf"):
                    continue
                a = torch.cat([p.detach().reshape(-1).abs() for p in group["params"]])
                cut = torch.tensor(b * headroom, dtype=a.dtype)  # as the step computes it
                tally["clamped"][g] += int((a >= cut).sum())
                tally["above"][g] += int((a > torch.tensor(b, dtype=a.dtype)).sum())
                tally["seen"][g] += a.numel()
        return out

    opt.step = counted


def measure(config: Path, headroom: float, seed: int, sets: list[str]) -> dict[str, Any]:
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import apply_overrides, from_dict, load_toml
    from trimtab.rl.run.runner import train

    tally = {k: [0, 0] for k in ("clamped", "above", "seen")}
    with tempfile.TemporaryDirectory(prefix="weight-clamp-") as tmp:
        data = apply_overrides(load_toml(config), [
            'run.device="cpu"', "run.progress=false", f'run.out="{tmp}/run"',
            'run.stability="adaptive"', f"run.seed={seed}", f"run.weight_headroom={headroom}",
            "gym.total_steps=30000", "gym.eval_episodes=5", *sets])  # fmt: skip
        summary = train(
            from_dict(TrainConfig, data),
            setup=lambda learner: counter(learner.agent.optimizer, headroom, tally),
        )
    frac = {k: [tally[k][g] / tally["seen"][g] if tally["seen"][g] else None for g in (0, 1)]
            for k in ("clamped", "above")}  # fmt: skip
    return {"headroom": headroom, "seed": seed, "updates": summary["updates"],
            "clamped": frac["clamped"], "above_bound": frac["above"],
            "weights_stepped": tally["seen"]}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, DEFAULT_OUT, key=True)
    p.add_argument("--config", type=Path, default=ROOT / "examples" / "cartpole.toml")
    p.add_argument("--headroom", nargs="+", type=float, default=[1.0, 2.0])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows, body = [], []
    for h in args.headroom:
        for seed in args.seeds:
            r = measure(args.config, h, seed, args.sets)
            rows.append(r)
            c, a = r["clamped"], r["above_bound"]
            body.append((f"{h:g}", seed, r["updates"], f"{c[0]:.2e} / {c[1]:.2e}",
                         f"{a[0]:.2%} / {a[1]:.2%}"))  # fmt: skip
            print(f"headroom {h:g}, seed {seed}: done", flush=True)
    header = ["headroom", "seed", "updates", "clamped: matrices / vectors", "above the bound"]
    print(markdown_table(header, body, "rrrrr"))
    command = invocation(__file__, argv)
    record = {**provenance("cpu"), "command": command, "config": str(args.config),
              "sets": args.sets, "runs": rows}  # fmt: skip
    save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
