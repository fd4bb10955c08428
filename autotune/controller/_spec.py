"""What the controller sends and records for one dispatched layout: the TrialSpec (the backend
protocol's input) and the model's prediction stored beside the measurement."""

from __future__ import annotations

import os
from typing import Any

from autotune._numbers import is_positive_finite
from autotune.backends import TrialSpec
from autotune.catalog import RECIPE_PACKAGES_ENV
from autotune.config import LayoutConfig, Workload
from autotune.controller.options import StudyOptions
from autotune.controller.state import SearchState
from autotune.cost import estimate
from autotune.megatron import benchmark_only
from autotune.megatron.overrides import layout_overrides
from autotune.space import SearchSpace
from autotune.storage import Study


def trial_spec(study: Study, space: SearchSpace, workload: Workload, options: StudyOptions, number: int,
               attempt: int, config: LayoutConfig, validation: bool = False,
               screening_step_s: float | None = None) -> TrialSpec:
    """The spec of one run; `validation`: a --validate-steps run (options.validate_steps measured steps, and
    a timeout for them: validation_timeout_s, from the layout's slowest screening step `screening_step_s`)."""
    w = workload
    backend_options = dict(study.backend_options)
    if space.document:
        # the worker rebuilds the model (architecture, recipe) from the study's own space text, not from
        # the file a worker image of another autotune version, or an edited file, holds now
        backend_options["space_document"] = space.document
        backend_options["space_source"] = space.source
    allowed = os.environ.get(RECIPE_PACKAGES_ENV)
    if allowed and isinstance(backend_options.get("env") or {}, dict):
        # the GPU worker reads the space text again (space_from_document), on a node whose environment is not the
        # one of whoever started autotune: it gets the recipe packages they allowed, as of this dispatch
        backend_options["env"] = {RECIPE_PACKAGES_ENV: allowed, **(backend_options.get("env") or {})}
    if w.cluster.network_gbps is not None:
        # the study's own figure (stored with it), not whatever the space file says when the worker reads it
        backend_options["network_gbps"] = w.cluster.network_gbps
    return TrialSpec(study=study.name, trial=number, model=w.model.name, gpus=w.cluster.gpus,
                     gpus_per_node=w.cluster.gpus_per_node, gpu=w.cluster.gpu.name,
                     global_batch_size=w.global_batch_size, seq_length=w.seq_length, precision=w.precision,
                     config=config.to_dict(),
                     overrides=layout_overrides(config, w) + benchmark_only.overrides(options.benchmark_settings),
                     attempt=attempt,
                     timeout_s=validation_timeout_s(options, screening_step_s) if validation else float(options.trial_timeout_s),
                     warmup_steps=int(options.warmup_steps),
                     measured_steps=int(options.validate_steps if validation else options.measured_steps),
                     seed=int(options.seed or 0),
                     backend_options=backend_options)


# A validation run's steps are allowed this many times the layout's slowest screening step: room for a slower
# node or a longer warm-up, not for a hang
VALIDATION_STEP_SLACK = 3.0


def validation_timeout_s(options: StudyOptions, screening_step_s: float | None = None) -> float:
    """A --validate-steps run's timeout: the screening's (--trial-timeout, which holds the start-up and a
    screening run) plus its steps, warm-up included, at VALIDATION_STEP_SLACK times the layout's slowest
    screening step (`screening_step_s`); without that figure (no screening run of it completed: a hand-edited
    store), the screening's timeout scaled by the steps against a screening run's. It was the screening's
    whatever the steps (found by review: with the default 3,600 s, 1,000 validation steps of a 20 s step could
    only end as `timeout`); scaling the whole timeout by the steps gave such a run 125 hours, so that a hung
    validation held the cluster, and every controller of the study waiting for it, for days (second review)."""
    timeout = float(options.trial_timeout_s)
    steps = int(options.warmup_steps) + int(options.validate_steps)
    if screening_step_s is not None and is_positive_finite(screening_step_s):
        return timeout + steps * VALIDATION_STEP_SLACK * float(screening_step_s)
    screening = max(1, int(options.warmup_steps) + int(options.measured_steps))
    return timeout * max(1.0, steps / screening)


def prediction(state: SearchState, workload: Workload, config: LayoutConfig) -> dict[str, Any]:
    """The cost model's prediction for `config` (from the study's precomputed arrays when it is in
    the legal set), as stored with the trial."""
    i = state.index.get(config.key())
    p = state.predicted
    if i is None:
        e = estimate(workload, config)
        return {"step_time_s": e.step_time_s, "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
                "peak_mem_gib": e.peak_mem_gib, "breakdown": e.breakdown}
    return {"step_time_s": float(p.step_time_s[i]), "tokens_per_s_per_gpu": float(p.tokens_per_s_per_gpu[i]),
            "peak_mem_gib": float(p.peak_mem_gib[i]), "mfu": float(p.mfu[i]),
            "breakdown": {k: float(v[i]) for k, v in p.breakdown_s.items()}}
