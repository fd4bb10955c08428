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
