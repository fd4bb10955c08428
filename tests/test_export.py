"""Export: recipe files compile and set exactly the tuned fields, overrides round-trip, refusals."""

from __future__ import annotations

import ast
import json

import pandas as pd
import pytest
import yaml

from autotune import export
from autotune.config import LayoutConfig
from autotune.errors import StudyError
from autotune.megatron.overrides import config_from_overrides, parse_overrides
from autotune.storage import Repository

# Every ConfigContainer path the exporter and the workers may set, as read from Megatron-Bridge 0.6 /
# Megatron-Core 0.19 (ConfigContainer in training/config.py, TransformerConfig / GPTModelProvider).
# tests/test_probe.py checks them against the real code where Python 3.12 is available.
BRIDGE_FIELDS = {
    "model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
    "model.virtual_pipeline_model_parallel_size", "model.context_parallel_size", "model.sequence_parallel",
    "model.expert_model_parallel_size", "model.expert_tensor_parallel_size", "model.seq_length",
    "model.recompute_granularity", "model.recompute_method", "model.recompute_num_layers", "model.cuda_graph_impl",
    "train.micro_batch_size", "train.global_batch_size", "dataset.seq_length", "ddp.use_distributed_optimizer",
    "optimizer.use_distributed_optimizer", "optimizer.use_precision_aware_optimizer", "mixed_precision",
}


def _study_with_trial(tmp_path, config: dict, status="completed", model="qwen3_30b", gpus=16, name="ex"):
    repo = Repository.open(f"sqlite:///{tmp_path / 'ex.db'}")
    from autotune.space import load_space, make_workload

    space = load_space(model)
    workload = make_workload(space, gpus=gpus)
    study = repo.create_study(name=name, model=model, workload=workload.to_dict(), space=space.to_dict(), budget=2,
                              sampler="auto", backend="simulate", backend_options={}, options={},
                              optuna_study_name=f"autotune:{name}", status="finished")
    layout = LayoutConfig.from_mapping(config)
    trial = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), 0, "c", 2)
    repo.finish_trial(study.id, trial.number, status,
                      metrics={"step_time_s": 30.0, "tokens_per_s_per_gpu": 8000.0, "tflops_per_gpu": 184.0,
                               "mfu": 0.186, "peak_mem_gib": 70.5})
    return repo, repo.get_study(name), layout


def _assignments(source: str) -> dict[str, object]:
    tree = ast.parse(source)
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    values = {}
    for node in function.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            path = ast.unparse(node.targets[0]).removeprefix("cfg.")
            values[path] = ast.literal_eval(node.value)
    return values


FULL = {"tp": 2, "pp": 2, "vpp": 2, "ep": 8, "sp": True, "mbs": 2, "recompute": "full", "recompute_method": "block",
        "recompute_num_layers": 2, "dist_opt": True}


def test_recipe_compiles_names_the_recipe_and_sets_exactly_the_tuned_values(tmp_path):
    repo, study, layout = _study_with_trial(tmp_path, FULL)
    source = export.render(repo, study, "recipe")
    compile(source, "recipe.py", "exec")
    assert "from megatron.bridge.recipes import qwen3_30b_a3b_pretrain_config as _base_recipe" in source
    values = _assignments(source)
    assert set(values) <= BRIDGE_FIELDS
    assert values["model.tensor_model_parallel_size"] == 2
    assert values["model.virtual_pipeline_model_parallel_size"] == 2
    assert values["model.expert_model_parallel_size"] == 8 and values["model.sequence_parallel"] is True
    assert values["model.recompute_granularity"] == "full" and values["model.recompute_method"] == "block"
    assert values["model.recompute_num_layers"] == 2 and values["model.cuda_graph_impl"] == "none"
    assert values["train.micro_batch_size"] == 2 and values["train.global_batch_size"] == 1024
    assert values["ddp.use_distributed_optimizer"] is values["optimizer.use_distributed_optimizer"] is True
    namespace: dict = {}
    exec(compile(source.replace("from megatron.bridge.recipes import", "# "), "r", "exec"), namespace)
    assert namespace["AUTOTUNE_PROVENANCE"]["measured"]["tokens_per_s_per_gpu"] == 8000.0


def test_deepseek_recipe_recomputes_its_pipeline_layout(tmp_path):
    repo, study, _ = _study_with_trial(tmp_path, {"tp": 2, "pp": 16, "ep": 64, "sp": True, "dist_opt": True},
                                       model="deepseek_v3", gpus=1024)
    source = export.render(repo, study, "recipe")
    compile(source, "recipe.py", "exec")
    assert "set_deepseek_v3_pipeline_model_parallel_layout as _set_pipeline_layout" in source
    assert "_set_pipeline_layout(cfg.model)" in source


def test_study_strings_cannot_inject_code(tmp_path):
    repo, study, _ = _study_with_trial(tmp_path, FULL, name='x"""\nimport os; os.system("echo pwned")\n#')
    source = export.render(repo, study, "recipe")
    tree = ast.parse(source)
    imports = [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all("megatron" in i or "__future__" in i for i in imports)
    assert not any(isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) for n in tree.body)


def test_overrides_round_trip_and_carry_the_torchrun_command(tmp_path):
    repo, study, layout = _study_with_trial(tmp_path, FULL)
    text = export.render(repo, study, "overrides")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert set(parse_overrides(lines)) <= BRIDGE_FIELDS
    assert config_from_overrides(lines) == layout
    command = next(line for line in text.splitlines() if "torchrun" in line)
    assert "--nnodes=2 --nproc-per-node=8" in command and "--recipe qwen3_30b_a3b_pretrain_config" in command


def test_yaml_and_json_documents(tmp_path):
    repo, study, layout = _study_with_trial(tmp_path, FULL)
    as_json = json.loads(export.render(repo, study, "json"))
    as_yaml = yaml.safe_load(export.render(repo, study, "yaml"))
    assert as_json["config"] == layout.to_dict() == as_yaml["config"]
    assert as_json["measured"]["tokens_per_s_per_gpu"] == 8000.0
    assert as_yaml["recipe_function"] == "qwen3_30b_a3b_pretrain_config"


def test_table_export_feeds_the_replay_backend(tmp_path):
    import threading

    from autotune.backends import TrialStatus, create_backend
    from tests.backends.backend_suite import make_spec

    repo, study, layout = _study_with_trial(tmp_path, FULL)
    path = tmp_path / "table.csv"
    path.write_text(export.render(repo, study, "table"))
    assert len(pd.read_csv(path)) == 1
    backend = create_backend("replay", {"replay": str(path)})
    outcome = backend.run(make_spec(config=layout.to_dict()), lambda r: None, threading.Event())
    assert outcome.status == TrialStatus.COMPLETED and outcome.step_time_s == 30.0


def test_refuses_without_a_completed_trial(tmp_path):
    repo, study, _ = _study_with_trial(tmp_path, FULL, status="oom")
    with pytest.raises(StudyError, match="no completed trial"):
        export.render(repo, study, "recipe")
    with pytest.raises(StudyError, match="is oom, not completed"):
        export.render(repo, study, "recipe", trial_number=1)


def test_export_cli_writes_a_file(cli, tmp_path):
    repo, study, _ = _study_with_trial(tmp_path, FULL)
    out = tmp_path / "tuned.py"
    result = cli("export", "ex", "--format", "recipe", "-o", str(out), "--storage", repo.url)
    assert result.returncode == 0, result.stderr
    compile(out.read_text(), str(out), "exec")
    refused = cli("export", "ex", "--trial", "7", "--format", "json", "--storage", repo.url)
    assert refused.returncode == 2 and "no trial 7" in refused.stderr


def test_export_takes_the_recommendation_and_warns_about_a_faster_layout_inside_the_memory_margin(tmp_path, cli):
    """The default export is what `autotune start` recommends: the best mean that keeps the headroom;
    a faster run that peaked inside the margin is named on stderr, and --trial still exports it."""
    repo, study, safe = _study_with_trial(tmp_path, FULL)  # trial 1: 8,000 tokens/s at 70.5 GiB
    risky = LayoutConfig.from_mapping({**FULL, "mbs": 1})
    trial = repo.claim_dispatch(study.id, risky.to_dict(), risky.key(), 1, "c", 2)
    repo.finish_trial(study.id, trial.number, "completed",  # faster, but 79 of 79.6 GiB: inside the 3.2 GiB margin
                      metrics={"step_time_s": 27.0, "tokens_per_s_per_gpu": 8900.0, "tflops_per_gpu": 204.0,
                               "mfu": 0.207, "peak_mem_gib": 79.0})
    assert export.choose_trial(repo, study, None).config_key == safe.key()
    from autotune import leaderboard

    summary = leaderboard.build(repo, study).summary  # the end-of-study summary gives the same answer
    assert (summary["best_trial"], summary["risky_faster_trials"]) == (1, [trial.number])
    assert summary["best_tokens_per_s_per_gpu"] == 8000.0 and summary["memory_headroom_gib"] == pytest.approx(3.2)
    url = str(repo.engine.url)
    result = cli("export", "ex", "--format", "json", "--storage", url)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["trial"] == 1
    assert f"trial {trial.number} measured 8,900" in result.stderr and "--trial 2" in result.stderr
    chosen = cli("export", "ex", "--format", "json", "--trial", "2", "--storage", url)
    assert json.loads(chosen.stdout)["trial"] == 2 and "margin" not in chosen.stderr
