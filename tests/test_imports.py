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
    for module in ("autotune.export", "autotune.leaderboard", "autotune.dashboard.server", "autotune.dispatch"):
        assert _modules_after_import(module, heavy) == [], module


def test_autotune_never_imports_workers():
    """workers/ depends on autotune, never the reverse: no autotune module names the workers package."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1] / "autotune"
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if re.search(r"^\s*(from|import)\s+workers\b", p.read_text(encoding="utf-8"), re.M)]
    assert offenders == []
