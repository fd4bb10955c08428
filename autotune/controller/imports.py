"""Bringing runs launched by hand into a study (`autotune import-log`).

The log is parsed with Megatron's own line formats (autotune.megatron.logparse); the run becomes a trial of
the study (origin "imported"), told to Optuna as an ordinary trial, and feeds the search
like any measurement. It does not use up the study's dispatch budget: autotune did not run it.
"""

from __future__ import annotations

from collections.abc import Iterable

from autotune.backends.validation import METRIC_KEYS, impossible_result
from autotune.config import LayoutConfig
from autotune.controller._optuna import OptunaStudy
from autotune.controller.outcomes import flops_in_one_convention, optuna_attrs
from autotune.space import study_space_and_workload
from autotune.cost import estimate
from autotune.cost.flops import tokens_per_s_per_gpu
from autotune.errors import ConfigError, IllegalLayoutError
from autotune.megatron.logparse import TooManyIterations, parse_log
from autotune.space import violations
from autotune.storage import Repository, Study, Trial, TrialNumbering
from autotune.storage.repository import stored_step_times


def import_log(repo: Repository, study: Study, layout: LayoutConfig, text: str | Iterable[str], source: str,
               space_and_workload: tuple | None = None) -> tuple[Trial, list[str]]:
    """The run whose Megatron log is `text` (its whole text, or its lines one at a time) as a trial of
    `study`, and notes for the user about what was stored other than the log says (one line each).
    `space_and_workload`: the study's (study_space_and_workload), when the caller has them already."""
    from autotune._paths import shown

    name = shown(source)  # on one line, whatever the file's name holds
    space, workload = space_and_workload or study_space_and_workload(study)
    notes: list[str] = []
    bad = violations(layout, workload)
    if bad:
        raise IllegalLayoutError(f"the layout given for the log breaks {bad[0].rule}: {bad[0].message}", bad)
    try:
        parsed = parse_log(text)
    except TooManyIterations as e:
        raise ConfigError(f"{name}: {e}: import a profiling run's log (or cut this one with head)") from None
    if parsed.unreadable_iterations:  # 1e9 ms, -5 ms: no figure Megatron prints; reading the rest would
        # measure the run by whichever lines happen to be readable, the warm-up alone if it is the only one
        raise ConfigError(f"{name}: {parsed.unreadable_iterations} iteration line(s) whose figures are no number "
                          "Megatron prints (an exponent, a sign); nothing imported")
    if parsed.unreadable_memory:  # -5 GB: the run's peak would be stored as unknown (or as another line's)
        raise ConfigError(f"{name}: {parsed.unreadable_memory} memory line(s) whose figures are no number "
                          "Megatron prints (an exponent, a sign); nothing imported")
    if parsed.max_reserved_gib is not None and parsed.max_allocated_gib is not None \
            and parsed.max_allocated_gib > parsed.max_reserved_gib * 1.001:  # PyTorch reserves what it allocates
        raise ConfigError(f"{name}: the log's peak allocated memory ({parsed.max_allocated_gib:.1f} GiB) exceeds its "
                          f"peak reserved memory ({parsed.max_reserved_gib:.1f} GiB), which cannot be; nothing imported")
    other_batches = sorted(parsed.global_batch_sizes - {workload.global_batch_size})
    if other_batches:  # review: a GBS-256 run was stored at four times its throughput, counted for 1024
        raise ConfigError(f"{name}: the log's iterations ran a global batch size of "
                          f"{', '.join(map(str, other_batches))}, the study's is {workload.global_batch_size}: "
                          "another workload; nothing imported")
    if parsed.failure == "oom":
        status = "oom"
    elif len(dict(parsed.iterations)) == 1:  # the warm-up alone (printed once or more): no steady-state step
        raise ConfigError(f"{name}: one iteration line, the warm-up: no steady-state step time; import a log "
                          "of two or more iterations")
    elif parsed.step_time_s is not None:
        status = "completed"
    else:
        raise ConfigError(f"{name}: no Megatron iteration lines and no recognisable failure in the log")
    metrics = {"peak_mem_gib": parsed.max_reserved_gib or parsed.max_allocated_gib}
    if status == "completed":
        step = parsed.step_time_s
        if not step > 0:
            raise ConfigError(f"{name}: the log's mean iteration time is {step * 1000:g} ms: not a measurement")
        tokens = tokens_per_s_per_gpu(workload.global_batch_size, workload.seq_length, workload.cluster.gpus, step)
        tflops = parsed.mean_tflops_per_gpu  # Megatron's own figure from the log, in its own FLOP count
        metrics.update(step_time_s=step, tokens_per_s_per_gpu=tokens, tflops_per_gpu=tflops,
                       mfu=tflops / workload.cluster.gpu.bf16_peak_tflops if tflops else None)
        metrics.update(flops_in_one_convention(metrics, workload, layout))
        if tflops is not None and metrics["tflops_per_gpu"] != tflops:
            # a 0, an overflow or another FLOP count: stored as this package counts it, and said so
            notes.append(f"the log's {tflops:g} TFLOP/s/GPU disagrees with its iteration time; stored "
                         f"{metrics['tflops_per_gpu']:.1f} TFLOP/s/GPU, counted from the iteration time")
    every_step = [t for _, t in parsed.iterations]  # warm-up too, all stored: an infinite one refuses the log
    problem = impossible_result(status, {**dict.fromkeys(METRIC_KEYS), **metrics}, every_step, workload, layout.tp,
                                estimate(workload, layout).peak_mem_gib)
    if problem:
        raise ConfigError(f"{name}: impossible figures in the log ({problem}); nothing imported")
    runs = [t for t in repo.trials(study.id) if t.config_key == layout.key()]  # the layout's runs, read once
    if status == "completed":
        _refuse_a_run_held_already(runs, every_step, name)
    notes.extend(_other_outcomes_of_the_layout(runs, status))
    optuna = OptunaStudy(repo.url, study.optuna_study_name, space, study.sampler, None, create=False,
                         backend=study.backend)
    reason = "out_of_memory" if status == "oom" else None
    number = optuna.add_measured(layout, metrics.get("tokens_per_s_per_gpu"), oom=status == "oom",
                                 attrs={**optuna_attrs(status, reason, None, metrics, "imported"), "log": source})
    # numbered like the study's other runs: with its Optuna trial number (models.TrialNumbering)
    trial = repo.add_imported(study.id, layout.to_dict(), layout.key(), number, status, metrics,
                              every_step, source,
                              number=number if study.numbering == TrialNumbering.OPTUNA else None)
    from autotune.leaderboard import METRICS_SOURCES

    if study.backend in METRICS_SOURCES:  # found by review: said nowhere, and its ± then mixes both kinds of run
        notes.append(f"the study's other runs are {METRICS_SOURCES[study.backend]}, not measured: this measured run "
                     "is compared with them as if alike, and its spread enters the study's run-to-run noise")
    return trial, notes


def _refuse_a_run_held_already(runs: list[Trial], every_step: list[float], name: str) -> None:
    """ConfigError when the study holds (in `runs`, the layout's trials) a completed run of this layout with the very same iteration times: the
    same log (or the log of a run the study made itself) imported again. Counted as another run it would
    narrow the study's run-to-run noise, and every ± on the leaderboard, with a repeat that is no measurement
    (review: eight imports of one log took the noise from 3% to 1.6%). Two real runs never print the same
    times for every iteration."""
    stored = stored_step_times(every_step)  # as add_imported will store them
    steps = _one_copy(stored)
    for trial in runs:
        if trial.status == "completed" and _one_copy(trial.step_times_s) == steps:
            raise ConfigError(f"{name}: the study holds this run already (trial {trial.number}: the same layout and "
                              f"the same {len(stored)} iteration times); imported again it would count as a second "
                              "measurement; nothing imported")


def _one_copy(steps: list[float]) -> list[float]:
    """`steps` without repeats of themselves: a log pasted twice into one file (its iteration lines 1..6, then
    1..6 again with the same times) holds the run once (found by review: imported beside the log itself, it
    counted as a second run). Logs of several ranks concatenated differ in their times and stay whole."""
    n = len(steps)
    for period in range(1, n // 2 + 1):
        if n % period == 0 and steps == steps[:period] * (n // period):
            return steps[:period]
    return steps


def _other_outcomes_of_the_layout(runs: list[Trial], status: str) -> list[str]:
    """A note when the study holds runs of this layout (`runs`, its trials) that ended the other way (found by a new-user pass: an OOM
    log of a layout that had completed was stored without a word). Both are kept, since a layout near the limit
    can do either (fragmentation, another node's driver); but the user should know the store now says both."""
    other = "oom" if status == "completed" else "completed"
    numbers = [t.number for t in runs if t.status == other]
    if not numbers:
        return []
    shown_numbers = ", ".join(map(str, numbers[:5])) + (", ..." if len(numbers) > 5 else "")
    if status == "oom":
        return [f"the study holds {len(numbers)} completed run(s) of this layout (trial {shown_numbers}); this "
                "out-of-memory run is stored beside them: the layout is no longer recommended as safe (it ran out of "
                "memory in one of its runs)"]
    return [f"the study holds {len(numbers)} out-of-memory run(s) of this layout (trial {shown_numbers}); this "
            "completed run is stored beside them, and the layout stays one that is not recommended as safe"]


def refresh_pooled_cache(repo: Repository, study: Study) -> None:
    """After an import, the study's stored pooling (recommend.pooled_cache_entry) no longer matches its
    runs: pool them again, once (the import-log command pays the GP's import), so `status`, `leaderboard`,
    `show`, `export` and the dashboard find it done instead of each pooling afresh. A running study's
    controller stores its own at its end; a backend whose runs repeat exactly pools nothing. Only a cache:
    whatever fails here (a store error, a hand-edited record the GP cannot fit) leaves the
    imported trial stored and the readers to pool; the caller calls it after the import has succeeded."""
    from autotune.controller.recommend import backend_repeats_exactly, pooled_cache_entry
    from autotune.storage import StudyStatus

    try:
        if backend_repeats_exactly(study.backend) or repo.get_study(study.name).status == StudyStatus.RUNNING:
            return
        repo.set_pooled_cache(study.id, pooled_cache_entry(repo.trials(study.id, dispatched_only=True)))
    except Exception:  # noqa: BLE001 - a cache: the import stands whatever happens here
        pass
