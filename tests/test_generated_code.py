"""Generated code: no string from a space file, a study or the database runs when a recipe is imported.

The attack of issue 13 item 1 is tried for real (a space YAML whose name closes the function and
calls os.system), through the CLI and through a space file edited after the study started (the study
reads the text it stored, not the file); the
exporter's own checks are tried with a table of hostile names; and an exported recipe for a study
whose name is hostile text is parsed to show its module level holds nothing but the expected
imports, one literal assignment and one function.
"""

from __future__ import annotations

import ast
import json
import os

import pytest

from autotune import export
from autotune.errors import ConfigError
from autotune.space import space_dir
from tests.conftest import run_cli

INJECTION = "x(): pass\n__import__('os').system('touch PWNED')\ndef y"
# not Python names: refused by the space reader (model names) and by the exporter (anything written as code)
NOT_NAMES = [INJECTION, "a; import os", "os.system('x')", "a b", "x\ny", "ümlaut", "", "1abc", "a.__import__('os')",
             'x"""', "a-b"]
KEYWORDS = ["def", "class", "import", "lambda"]  # names, but not usable ones: the exporter refuses them too
ENV = {"RAY_AUTH_MODE": "disabled"}


def _hostile_space(folder, name: str = INJECTION):
    text = (space_dir() / "qwen3_30b.yaml").read_text().replace("name: qwen3_30b", f"name: {json.dumps(name)}", 1)
    path = folder / "hostile.yaml"
    path.write_text(text)
    return path


def test_the_injection_through_start_and_export_never_runs(tmp_path):
    path = _hostile_space(tmp_path)
    url = f"sqlite:///{tmp_path / 's.db'}"
    result = run_cli("start", "--model", INJECTION, "--space", str(path), "--budget", "1", "--sim-seconds", "0",
                     "--study", "pwn", "--storage", url, env=ENV)
    assert result.returncode == 2 and "key 'name'" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("export", "pwn", "--format", "recipe", "-o", str(tmp_path / "r.py"), "--storage", url)
    assert result.returncode == 2 and not (tmp_path / "r.py").exists()
    assert not (tmp_path / "PWNED").exists() and not os.path.exists("PWNED")


def test_a_space_file_edited_after_the_study_started_cannot_inject(tmp_path):
    path = tmp_path / "copy.yaml"
    path.write_text((space_dir() / "qwen3_30b.yaml").read_text())
    url = f"sqlite:///{tmp_path / 's.db'}"
    result = run_cli("start", "--model", "qwen3_30b", "--space", str(path), "--budget", "1", "--sim-seconds", "0",
                     "--study", "edited", "--storage", url, "--json", env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    _hostile_space(tmp_path).replace(path)  # the recorded space source now holds the attack
    out = tmp_path / "recipe.py"
    # the study was rebuilt from the text it stored when it began: the edited file is never read
    result = run_cli("export", "edited", "--format", "recipe", "-o", str(out), "--storage", url)
    assert result.returncode == 0, result.stderr
    recipe = out.read_text()
    assert "PWNED" not in recipe and "__import__" not in recipe
    assert "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config" in recipe
    compile(recipe, str(out), "exec")
    assert not (tmp_path / "PWNED").exists() and not os.path.exists("PWNED")


@pytest.mark.parametrize("name", NOT_NAMES + KEYWORDS, ids=range(len(NOT_NAMES + KEYWORDS)))
def test_the_exporter_writes_no_name_that_is_not_an_identifier(name):
    with pytest.raises(ConfigError):
        export._python_name(name, "the recipe function")


@pytest.mark.parametrize("name", NOT_NAMES + ["a" * 65], ids=range(len(NOT_NAMES) + 1))
def test_a_space_file_with_a_hostile_name_is_refused(tmp_path, name):
    from autotune.space import load_space

    with pytest.raises(ConfigError, match="key 'name'"):
        load_space(str(_hostile_space(tmp_path, name)))


def test_hostile_study_names_stay_inside_literals(tmp_path):
    from tests.test_export import _study_with_trial

    # printable, as every study name is (`start` and the store's read refuse line breaks): one line
    name = '"""; __import__("os").system("touch PWNED") #\'\'\' \\'
    repo, study, _ = _study_with_trial(tmp_path, {"ep": 8}, name=name)
    source = export.render(repo, study, "recipe")
    tree = ast.parse(source)
    kinds = [type(node).__name__ for node in tree.body]
    # `import torch` for the optimizer-state dtypes a layout without the distributed optimizer sets
    assert kinds == ["Expr", "ImportFrom", "Import", "ImportFrom", "Assign", "FunctionDef"], kinds
    assert ast.unparse(tree.body[2]) == "import torch"
    provenance = ast.literal_eval(next(n for n in tree.body if isinstance(n, ast.Assign)).value)
    assert provenance["study"] == name
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    calls = [ast.unparse(n.func) for n in ast.walk(function) if isinstance(n, ast.Call)]
    assert calls == ["_base_recipe"]  # the only call anywhere: the recipe itself


@pytest.mark.parametrize("target", [f"megatron.bridge.recipes.qwen:{bad}" for bad in NOT_NAMES[:6] + KEYWORDS[:1]]
                         + [f"{bad}:qwen3_8b_pretrain_config" for bad in ("os;x", "a b", "import", "x\ny")],
                         ids=range(11))
def test_the_recipe_import_writes_only_checked_names(target):
    """The recipe module imports the catalog's recipe target by name: both parts must be Python names."""
    import dataclasses

    from autotune.space import get_model

    model = dataclasses.replace(get_model("qwen3_8b"), recipe_target=target)
    with pytest.raises(ConfigError, match="is not a Python name"):
        export.recipe_import(model)


def test_a_space_file_with_a_hostile_recipe_target_is_refused(tmp_path):
    from autotune.space import load_space

    text = (space_dir() / "qwen3_30b.yaml").read_text()
    target = "megatron.bridge.recipes.qwen.h100.qwen3_moe:qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"
    assert target in text
    path = tmp_path / "hostile.yaml"
    path.write_text(text.replace(target, json.dumps("os:system('touch PWNED')")))
    with pytest.raises(ConfigError, match="recipe.target"):
        load_space(str(path))
