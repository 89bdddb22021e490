"""The import graph of trimtab: no cycles, kernels are leaves (design invariant 8), and importing
the public modules never imports Triton (STYLE: Triton loads lazily, on first kernel use).

The graph is read from the source (the AST of every module), so it counts every import: at module
level, inside functions, and under ``TYPE_CHECKING``, which Python alone would never report.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import trimtab

SRC = Path(trimtab.__file__).resolve().parent
KERNELS = "trimtab.kernels"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _targets(node: ast.Import | ast.ImportFrom, here: str, is_pkg: bool, known: set[str]):
    """The trimtab modules one import statement loads (``from m import sub``: the submodule)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "trimtab"]
    if node.level:  # relative: resolve against this module's package
        package = here.split(".") if is_pkg else here.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([node.module] if node.module else [])])
    else:
        base = node.module or ""
    if base.split(".")[0] != "trimtab":
        return []
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.append(sub if sub in known else base)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the trimtab modules it imports anywhere in its source."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_targets(node, name, path.name == "__init__.py", known))
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path = [root]
        stack = [iter(sorted(graph.get(root, ())))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert "trimtab.kernels.ema" in graph and "trimtab.sentinel" in graph
    # function-level imports count: the public entries import their kernels lazily
    assert "trimtab.kernels.sentinel" in graph["trimtab.sentinel"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_kernels_import_only_kernels():
    bad = {
        f"{name} imports {target}"
        for name, targets in import_graph().items()
        if name == KERNELS or name.startswith(KERNELS + ".")
        for target in targets
        if target != KERNELS and not target.startswith(KERNELS + ".")
    }
    assert not bad, "kernels are leaves (design invariant 8): " + "; ".join(sorted(bad))


def test_public_modules_do_not_import_triton():
    code = (
        "import sys\n"
        "import trimtab\n"
        "assert 'triton' not in sys.modules, 'import trimtab'\n"
        "import trimtab.sentinel, trimtab.clamp, trimtab.clip, trimtab.estimate\n"
        "import trimtab.engagement, trimtab.quantile\n"
        "loaded = sorted(m for m in sys.modules if m == 'triton' or m.startswith('triton.'))\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_the_optimizer_does_not_load_torch_dynamo():
    """torch.optim.Optimizer's add_param_group, state_dict and load_state_dict import
    torch._dynamo on their first call (1.6 s here, ~5 s on the H200 host); trimtab's Adam calls
    them undecorated, so a training run never pays it."""
    code = (
        "import sys, torch\n"
        "import trimtab\n"
        "p = torch.nn.Parameter(torch.ones(3))\n"
        "opt = trimtab.optim.Adam([p], lr=1e-3)\n"
        "p.grad = torch.ones(3)\n"
        "opt.step()\n"
        "opt.load_state_dict(opt.state_dict())\n"
        "opt.step()\n"
        "assert 'torch._dynamo' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_public_names_are_typed_and_lazy():
    """Every public name is in the literal ``__all__``, imported under ``TYPE_CHECKING`` from the
    module it loads from at run time (what type checkers and IDEs read), and resolves to it."""
    import importlib

    source = (SRC / "__init__.py").read_text()
    tree = ast.parse(source)
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom), ast.dump(imp)
                for alias in imp.names:
                    mod = f"{imp.module}.{alias.name}" if imp.module == "trimtab" else imp.module
                    typed[alias.name] = mod
    exports = trimtab._EXPORTS
    assert typed == exports
    assert sorted(trimtab.__all__) == sorted(["__version__", *exports])
    for name, module in exports.items():
        mod = importlib.import_module(module)
        want = mod if module == f"trimtab.{name}" else getattr(mod, name)
        assert getattr(trimtab, name) is want, name


def test_the_library_imports_none_of_the_trainers_dependencies():
    """``pip install trimtab`` is torch, numpy and Triton: importing the library and guarding a
    step loads none of the trainer's packages (its [train] extra; tqdm is not listed: torch
    itself imports it where it is installed)."""
    code = (
        "import sys, torch, trimtab\n"
        "m = torch.nn.Linear(3, 1); g = trimtab.Guard(m, torch.optim.Adam(m.parameters()))\n"
        "g.step(m(torch.randn(4, 3)).square().mean())\n"
        "heavy = ('ray', 'pandas', 'gymnasium', 'matplotlib', 'tensorboard', 'tomli_w')\n"
        "print(sorted({n.split('.')[0] for n in sys.modules} & set(heavy)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
