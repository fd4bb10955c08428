"""House rule 6: importing autotune and building the CLI imports no heavy stack."""

from __future__ import annotations

import subprocess
import sys


def test_help_imports_nothing_heavy():
    code = ("import sys, autotune, autotune.cli; autotune.cli.build_parser(); "
            "print(sorted(m for m in ('ray', 'torch', 'megatron', 'optuna', 'sqlalchemy', 'pandas', 'numpy', "
            "'selenium', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_workers_import_without_megatron_or_torch():
    code = "import sys, workers.launcher, workers.result, workers.rank_wrapper; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def _modules_after_import(module: str, candidates: tuple[str, ...]) -> list[str]:
    code = f"import sys, {module}; print(sorted(m for m in {candidates!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return eval(result.stdout.strip())  # a printed list of module names


def test_the_read_side_imports_neither_optuna_nor_ray_nor_the_controller():
    """Export, leaderboard and dashboard read SQL and space files; the search stack stays out (issue 12)."""
    heavy = ("optuna", "ray", "torch", "sklearn", "autotune.controller.session", "autotune.controller.loop")
    for module in ("autotune.export", "autotune.leaderboard", "autotune.dashboard.server", "autotune.metrics",
                   "autotune.dispatch"):
        assert _modules_after_import(module, heavy) == [], module


def test_autotune_never_imports_workers():
    """workers/ depends on autotune, never the reverse: no autotune module names the workers package."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1] / "autotune"
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if re.search(r"^\s*(from|import)\s+workers\b", p.read_text(encoding="utf-8"), re.M)]
    assert offenders == []


def _autotune_import_graph() -> dict[str, set[str]]:
    """module -> the autotune modules it imports anywhere (function-level imports included: a lazy
    import is still a dependency), with the packages an import passes through."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    paths = {}
    for path in (root / "autotune").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + [base] * bool(base))
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names)
        deps = set()
        for module in found:
            bits = module.split(".")
            deps.update(m for m in (".".join(bits[:i]) for i in range(1, len(bits) + 1))
                        if m in paths and m != name and not name.startswith(m + "."))
        graph[name] = deps
    return graph


def test_no_import_cycle_inside_autotune():
    graph = _autotune_import_graph()
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []
    # the layers the issue named: catalog is data, the cost model does not reach into legality
    assert "autotune.space" not in graph["autotune.catalog"]
    assert not {m for m in graph["autotune.cost.step_time"] if m.startswith("autotune.space")}
    # the store depends on no backend, dispatcher or controller (its read bounds once imported a backend's
    # constant; what both layers share lives below them, in the catalog)
    storage = {m for name, deps in graph.items() if name.startswith("autotune.storage") for m in deps}
    assert not {m for m in storage if m.startswith(("autotune.backends", "autotune.dispatch", "autotune.controller"))}
