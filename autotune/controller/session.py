"""Creating, opening and running studies: what `autotune start` and `autotune resume` do.

Everything a user can get wrong is checked before the database changes (house rule: bad input
leaves the database untouched): the model and space, an empty legal set (naming the rule that
empties it), budget, sampler, backend and its options, a taken study name (an autotune study's, or
an Optuna study's that autotune did not create).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable

from autotune.backends import ResourceRequest, backend_class
from autotune.config import MAX_BUDGET, LayoutConfig, Workload
from autotune.controller.knobs import with_knob_phase
from autotune.controller.loop import Controller
from autotune.controller.options import StudyOptions
from autotune.controller.strategies import STRATEGIES, make_strategy
from autotune.errors import ConfigError, StudyError
from autotune.space import SearchSpace, enumerate_legal, study_space_and_workload  # noqa: F401 (re-exported)
from autotune.storage import MAX_STUDY_NAME, Repository, Study, StudyStatus, TrialNumbering, is_study_name



def check_backend(backend: str, options: dict[str, Any]) -> dict[str, Any]:
    """Validate the backend name and its options here, before anything is written or dispatched."""
    return backend_class(backend).check_options(options)


def check_sampler(sampler: str) -> str:
    if sampler not in STRATEGIES:
        raise ConfigError(f"unknown sampler {sampler!r} (known: {', '.join(STRATEGIES)})")
    return sampler


def replay_coverage(space: SearchSpace, workload: Workload, path: str) -> tuple[int, int, int, int]:
    """(legal layouts the table measured, legal layouts it lacks, layouts of the table not legal here, rows
    that are performance-knob variants of a legal layout). The search runs a table's plain layouts (the
    legal set is restricted to them, key for key) and the knob phase their variants; a variant row was
    counted "not legal here" (review), then counted as its plain layout, which the search does not run."""
    import json

    from autotune.backends.replay import ReplayBackend

    legal = {c.key() for c in enumerate_legal(space, workload).configs}
    keys = ReplayBackend.answerable_layouts({"replay": path})
    plain = {key: LayoutConfig.from_mapping(json.loads(key)).layout_only().key() for key in keys}
    variants = sum(layout != key and layout in legal for key, layout in plain.items())
    foreign = len(set(plain.values()) - legal)
    return len(legal & keys), len(legal - keys), foreign, variants


def check_space_not_empty(space: SearchSpace, workload: Workload) -> list[LayoutConfig]:
    """The legal layouts; ConfigError naming the emptiest rule when there are none."""
    legal = enumerate_legal(space, workload)
    if not legal.configs:
        rule = legal.emptiest_rule()
        # the space's own domains may leave nothing legal without any --fix (review: "with these --fix values"
        # was said to a user who had given none)
        raise ConfigError(f"no legal layout for {workload.model.name} on {workload.cluster.gpus} GPUs in this search "
                          f"space (its knob domains and any fixed knob values): rule {rule} rejects most candidates (see "
                          f"`autotune space`)")
    return legal.configs


def check_some_layout_fits(workload: Workload, legal: list[LayoutConfig]) -> None:
    """ConfigError when no legal layout is predicted to fit even loosely: the search never dispatches a
    layout whose chance to fit is below P_FIT_REJECT (SearchState.candidates), so such a study would end
    at once with nothing run (a sequence of 10**9 tokens, say) instead of saying why."""
    import numpy as np

    from autotune.controller.state import P_FIT_REJECT
    from autotune.controller.surrogate import MemoryFeasibility
    from autotune.cost import estimate_many

    peaks = estimate_many(workload, legal).peak_mem_gib
    gpu = workload.cluster.gpu
    fit = MemoryFeasibility(peaks, np.zeros(len(legal), dtype=np.int64), gpu.memory_gib).p_fit()
    if float(fit.max()) < P_FIT_REJECT:
        raise ConfigError(f"no legal layout of {workload.model.name} on {workload.cluster.gpus}x {gpu.name} is "
                          f"predicted to fit in its {gpu.memory_gib:g} GiB: the smallest predicted peak is "
                          f"{float(peaks.min()):,.0f} GiB (sequence length {workload.seq_length:,}, global batch "
                          f"{workload.global_batch_size:,}); use more GPUs, a larger GPU or a shorter sequence")


def default_study_name(workload: Workload) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{workload.model.name}-{workload.cluster.gpus}g-{stamp}"


def check_study_inputs(space: SearchSpace, workload: Workload, budget: int, sampler: str, backend: str,
                       backend_options: dict[str, Any]) -> None:
    """Every check of `create_study` that needs no database: run it before storage is even opened."""
    if not 0 < budget <= MAX_BUDGET:
        raise ConfigError(f"--budget must be a positive number of trials up to {MAX_BUDGET:,}, got {budget}")
    check_sampler(sampler)
    check_backend(backend, backend_options)
    backend_class(backend).check_for_workload(backend_options, workload)
    if backend_class(backend).runs_the_recipe:
        from autotune.catalog import require_exportable, require_runnable_recipe

        require_exportable(workload.model, f"run the {backend} backend on")
        require_runnable_recipe(workload.model)
    configs = check_space_not_empty(space, workload)  # enumerated once, for every check
    check_some_layout_fits(workload, configs)
    answerable = backend_class(backend).answerable_layouts(backend_options)
    if answerable is not None:
        # keyed only here: keying every legal layout costs ~1.5 s at 64 GPUs, and only replay needs it
        legal = {c.key() for c in configs}
        if not legal & answerable:
            raise ConfigError(f"--backend {backend}: none of the {len(answerable)} layouts it can answer is legal "
                              f"for {workload.model.name} on {workload.cluster.gpus} GPUs")


def create_study(repo: Repository, *, name: str | None, space: SearchSpace, workload: Workload, budget: int,
                 sampler: str, backend: str, backend_options: dict[str, Any], seed: int | None,
                 options: dict[str, Any] | None = None) -> Study:
    from autotune.controller._optuna import OptunaStudy

    from autotune._paths import with_absolute_workdir

    backend_options = with_absolute_workdir(backend_options)  # the Python API's too, not only the CLI's
    if backend == "megatron":  # written out, as the CLI writes it: a study stored without it ran all-to-all (review)
        backend_options = {"dispatcher": "recipe", **backend_options}
    space = without_unrunnable_dispatchers(space, workload, backend, backend_options)
    check_study_inputs(space, workload, budget, sampler, backend, backend_options)
    name = check_study_name(name or default_study_name(workload))
    stored = study_options(options, seed).to_stored()
    check_name_free(repo, name)
    # the Optuna study carries the study's name (`optuna.load_study(study_name=name)`); one that autotune
    # left from a start that failed half-way is replaced, another tool's is a StudyError
    OptunaStudy(repo.url, name, space, sampler, seed, create=True)
    try:
        return repo.create_study(name=name, model=workload.model.name, workload=workload.to_dict(),
                                 space=space.to_dict(), budget=budget, sampler=sampler, backend=backend,
                                 backend_options=backend_options,
                                 options=stored, optuna_study_name=name, numbering=TrialNumbering.OPTUNA.value,
                                 status=StudyStatus.CREATED.value)
    except BaseException:
        _drop_orphan_optuna_study(repo.url, name)  # both records or neither
        raise


def without_unrunnable_dispatchers(space: SearchSpace, workload: Workload, backend: str,
                                   backend_options: dict[str, Any]) -> SearchSpace:
    """The space without its dispatcher knobs when every run is all-to-all (the megatron backend's `dispatcher:
    alltoall`, for a container without the flex backends): a flex variant could not run there, and its SM count
    would mean nothing."""
    import dataclasses

    from autotune.megatron.overrides import dispatcher_forced

    if not (workload.model.architecture.is_moe and dispatcher_forced(backend, backend_options)):
        return space
    return dataclasses.replace(space, perf_domains={k: v for k, v in space.perf_domains.items()
                                                    if k not in ("dispatcher", "dispatcher_sms")})


def check_name_free(repo: Repository, name: str) -> None:
    """StudyError when the store already holds a study of that name."""
    if repo.find_study(name) is not None:
        raise StudyError(f"study {name!r} already exists: continue it with `autotune resume {name}` "
                         "or choose another --study")


def check_study_name(name: str) -> str:
    """A study name the stores take: 1..200 printable characters (no newline, no control character)."""
    if not is_study_name(name):  # the store refuses any other where it reads or writes a study
        raise ConfigError(f"--study must be 1..{MAX_STUDY_NAME} printable characters, got {len(name)} "
                          f"character(s): {name[:40]!r}")
    # a new study only (the store still reads older ones): a blank name is a blank row, and a name like
    # an option (`--help`) cannot be given to `leaderboard` or `resume` (found by review)
    if name != name.strip() or name.startswith("-"):
        raise ConfigError(f"--study {name[:40]!r}: a study name neither starts with '-' nor starts or ends "
                          "with a space")
    if name in (".", ".."):  # its dashboard address /study/.. is /, for browsers (review): no page reached it
        raise ConfigError(f"--study {name!r}: a study name is not '.' or '..' (its web address would not be its own)")
    return name


def study_options(options: dict[str, Any] | None, seed: int | None) -> StudyOptions:
    """The study's options, defaults filled in (controller/options.py); an unknown key is a ConfigError."""
    try:
        return StudyOptions(**{**(options or {}), "seed": seed})
    except TypeError as exc:  # an option this version does not know
        raise ConfigError(f"unknown study option: {exc}") from None


def _drop_orphan_optuna_study(url: str, optuna_name: str) -> None:
    """Delete the Optuna study just created for an autotune study that could not be recorded."""
    import optuna

    try:
        optuna.delete_study(study_name=optuna_name, storage=url)
    except KeyError:
        pass  # there was none


def recipe_baseline(space: SearchSpace) -> LayoutConfig:
    return LayoutConfig.from_mapping(space.model.defaults.layout)


def start_ray_dispatcher(backend: str, backend_options: dict[str, Any], workload: Workload, *,
                         ray_address: str | None = None, local_gpus: int | None = None,
                         max_concurrent: int | None = None):
    """A RayDispatcher for the study's backend and workload, started: Ray connected (or a local Ray
    started) and the trial slots placed. `autotune start` calls it before the study is stored, so a
    Ray cluster that cannot be reached or is too small leaves no study behind (ConfigError, one line)."""
    from autotune.dispatch._ray import RayDispatcher

    resources = ResourceRequest.for_workload(workload.cluster.gpus, workload.cluster.gpus_per_node,
                                             backend_class(backend).one_bundle_per_node)
    dispatcher = RayDispatcher(backend, backend_options, resources, address=ray_address,
                               local_gpus=local_gpus, max_concurrent=max_concurrent)
    try:
        dispatcher.start()
    except BaseException:
        dispatcher.shutdown()
        raise
    return dispatcher


def build_controller(repo: Repository, study: Study, *, ray_address: str | None = None,
                     local_gpus: int | None = None, max_concurrent: int | None = None,
                     on_tick: Callable[[Controller], None] | None = None, dispatcher=None) -> Controller:
    """The study's controller. `dispatcher`: "inprocess", a started dispatcher (start_ray_dispatcher), or
    None for a RayDispatcher started here."""
    space, workload = study_space_and_workload(study)
    if backend_class(study.backend).runs_the_recipe:  # resumed: the recipe packages allowed now
        from autotune.catalog import require_runnable_recipe

        require_runnable_recipe(workload.model)
    if dispatcher == "inprocess":
        from autotune.dispatch._inprocess import InProcessDispatcher

        dispatcher = InProcessDispatcher(study.backend, study.backend_options, concurrency=max_concurrent or 1)
    elif dispatcher is None:
        dispatcher = start_ray_dispatcher(study.backend, study.backend_options, workload, ray_address=ray_address,
                                          local_gpus=local_gpus, max_concurrent=max_concurrent)
    try:
        options = StudyOptions.from_stored(study.options)
        strategy = with_knob_phase(make_strategy(study.sampler, study.budget, options.seed, recipe_baseline(space),
                                                 space), options.knob_share)
        strategy.remeasure = not backend_class(study.backend).repeatable_results
        return Controller(repo, study, space, workload, strategy, dispatcher, baseline=recipe_baseline(space),
                          on_tick=on_tick)
    except BaseException:
        dispatcher.shutdown()  # never leave placement groups or a local Ray behind
        raise

