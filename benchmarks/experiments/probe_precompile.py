"""Which kernel variants a CUDA run still compiles itself with ``run.precompile`` on, and why:
for each, whether its specialisation is in the device's manifest, and which part of Triton's
cache key differs between the run's own compile and the workers' ``JITFunction.preload`` of the
same specialisation (the function's source hash, the argument attributes, the constants, the
options, the backend, the environment).

    python benchmarks/experiments/probe_precompile.py [--set KEY=VALUE ...]

A short default market run (2 folds of 100 steps) in this process, with an empty Triton cache,
the precompiling workers on; prints one line per variant (cache hit, or compiled in the run) and,
under each compiled one, the differing key parts; ``--out`` also writes them as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from typing import Any


def main(argv: list[str] | None = None) -> None:
    from trimtab.benchmarking import benchmark_parser, own_triton_cache

    own_triton_cache("probe_precompile")  # an empty one, before anything imports Triton

    p = benchmark_parser(__doc__, None, out_help="a JSON file for the lines printed")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)

    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime import jit
    from triton.runtime.cache import get_cache_key

    from trimtab.kernels import precompile
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import apply_overrides, from_dict
    from trimtab.rl.run.runner import train

    mode, rows = ["run"], []
    compile_variant = jit.JITFunction._do_compile

    def keyed(self: Any, key: Any, signature: Any, device: Any, constexprs: Any, options: Any,
              attrs: Any, warmup: Any) -> Any:  # fmt: skip
        backend = self.device_caches[device][3]
        src = self.ASTSource(self, signature, constexprs, attrs)
        env = get_cache_invalidating_env_vars()
        rows.append({"mode": mode[0], "kernel": self.fn.__qualname__,
                     "key": get_cache_key(src, backend, options, env), "source": self.cache_key,
                     "ast": src.hash(), "options": options.hash(), "backend": backend.hash(),
                     "env": str(sorted(env.items())), "attrs": str(attrs),
                     "constants": repr(sorted(src.constants.items())),
                     "signature": repr(sorted(signature.items())),
                     "option_values": repr(sorted(options.__dict__.items()))})  # fmt: skip
        if mode[0] == "run":
            return compile_variant(self, key, signature, device, constexprs, options, attrs, warmup)
        return None  # the preload's key only

    jit.JITFunction._do_compile = keyed
    with tempfile.TemporaryDirectory(prefix="probe-precompile-") as tmp:
        sets = ['run.device="cuda"', "run.progress=false", f'run.out="{tmp}/run"',
                "walkforward.folds=2", "walkforward.steps_per_fold=100",
                "walkforward.learning_starts=256", *args.sets]  # fmt: skip
        cfg = from_dict(TrainConfig, apply_overrides({}, sets))
        with precompile.record() as entries:
            summary = train(cfg)
    print("workers:", json.dumps(summary.get("precompile")))
    ran = list(rows)
    path, reason = precompile.manifest_for()
    listed = {e["specialization"] for e in precompile.read_manifest(path)} if path else set()
    print("manifest:", reason)
    found: list[dict[str, Any]] = []
    for e in entries:
        name = e["kernel"].split(":")[1]
        inside = e["specialization"] in listed
        found.append({"kernel": name, "compiled_s": e["seconds"], "in_manifest": inside,
                      "differs": {}})  # fmt: skip
        if e["seconds"] == 0:
            print(f"  hit       {name}")
            continue
        print(f"  COMPILED  {name} ({e['seconds']:.2f} s), its specialisation "
              f"{'is' if inside else 'is NOT'} in the manifest")  # fmt: skip
        mode[0] = "preload"
        n = len(rows)
        precompile.resolve_kernel(e["kernel"]).preload(e["specialization"])
        mine = rows[n]
        ident = ("kernel", "signature", "constants")
        same = [r for r in ran if all(r[k] == mine[k] for k in ident)]
        for part in ("source", "ast", "attrs", "options", "option_values", "backend", "env"):
            if same and same[-1][part] != mine[part]:
                found[-1]["differs"][part] = {"run": same[-1][part], "preload": mine[part]}
                print(f"      {part}: run {same[-1][part][:300]}\n      {'':{len(part)}}  "
                      f"preload {mine[part][:300]}")  # fmt: skip
        fresh = subprocess.run(
            [sys.executable, "-c", "from trimtab.kernels import precompile as p; "
             f"print(p.resolve_kernel({e['kernel']!r}).cache_key)"],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
        if same:
            found[-1]["source_same_in_fresh_process"] = fresh == same[-1]["source"]
            print(f"      the function's source hash in a fresh process is "
                  f"{'the same' if fresh == same[-1]['source'] else 'DIFFERENT'}")  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps({"workers": summary.get("precompile"), "manifest": reason,
                                        "variants": found}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
