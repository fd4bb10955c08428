"""The controller: one process, the only writer of its trials to SQL and Optuna.

    ask (strategy / Optuna) -> legality -> memory pre-filter -> OOM frontier -> dedupe
        rejected: recorded with its rule, told to Optuna as infeasible, not counted in the budget
        else:     recorded as dispatched (committed) -> submitted to Ray
    poll: step reports -> slow-branch pruner -> cancel
          outcome -> committed to SQL -> told to Optuna -> fed back to the search state

A trial whose controller died (its heartbeat went stale) is adopted and re-run once as `lost`;
a second loss fails it. Several controllers may share one study on PostgreSQL: the budget and
"each layout dispatched once" are enforced by the database (see storage.repository).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from autotune.backends import TrialOutcome, TrialSpec, TrialStatus, backend_class
from autotune.backends.runs import harvest
from autotune.backends.validation import impossible_result, is_plausible_step
from autotune.config import LayoutConfig, Workload
from autotune.controller._optuna import OptunaStudy
from autotune.controller._recovery import abandoned
from autotune.controller.pruning import SlowBranchPruner
from autotune.controller.recommend import Recommendation, recommend, default_headroom_gib
from autotune.controller.state import P_FIT_REJECT, SearchState
from autotune.controller.strategies import REMEASURE, Proposal, Strategy
from autotune.cost import estimate
from autotune.cost.flops import model_tflops_per_gpu, tokens_per_s_per_gpu
from autotune.overrides import layout_overrides
from autotune.space import SearchSpace, enumerate_legal, policy_violations, violations
from autotune.storage import ClaimRefused, Repository, Study, StudyStatus, Trial
from autotune.storage.models import utcnow

if TYPE_CHECKING:
    from autotune.dispatch import Dispatcher

HEARTBEAT_S = float(os.environ.get("AUTOTUNE_HEARTBEAT_S", "5"))
STALE_AFTER_HEARTBEATS = 3
MAX_REJECTIONS_PER_DISPATCH = 2000
MAX_ATTEMPTS = 2  # a lost trial is retried once
VALIDATION = "validation"  # the strategy note of a longer run of the winner after the study


@dataclass
class RunSummary:
    study: str
    counts: dict[str, int]
    best: Trial | None
    baseline: Trial | None
    elapsed_s: float
    controller_s_per_trial: float
    stop_reason: str
    recommendation: Recommendation | None = None  # the best layout by its mean over runs


@dataclass
class _Running:
    trial: Trial
    spec: TrialSpec
    steps: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)


def derive_metrics(outcome: TrialOutcome, workload: Workload, config: LayoutConfig) -> dict[str, float | None]:
    """Fill throughput, TFLOP/s and MFU that a backend left out, from step time and model FLOPs."""
    metrics = outcome.metrics()
    step = metrics["step_time_s"]
    if step:
        w = workload
        tokens = metrics["tokens_per_s_per_gpu"] or tokens_per_s_per_gpu(w.global_batch_size, w.seq_length,
                                                                         w.cluster.gpus, step)
        metrics["tokens_per_s_per_gpu"] = tokens
        if metrics["tflops_per_gpu"] is None:
            metrics["tflops_per_gpu"] = model_tflops_per_gpu(w.model.architecture, w.seq_length, config.tp, tokens)
        if metrics["mfu"] is None:
            metrics["mfu"] = metrics["tflops_per_gpu"] / workload.cluster.gpu.bf16_peak_tflops
    return metrics


class Controller:
    def __init__(self, repo: Repository, study: Study, space: SearchSpace, workload: Workload,
                 strategy: Strategy, dispatcher: "Dispatcher", *, baseline: LayoutConfig | None = None,
                 on_tick: Callable[["Controller"], None] | None = None) -> None:
        self.repo, self.study, self.space, self.workload = repo, study, space, workload
        self.strategy, self.dispatcher, self.baseline = strategy, dispatcher, baseline
        self.on_tick = on_tick or (lambda _c: None)
        self.controller_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        opts = study.options
        self.optuna = OptunaStudy(repo.url, study.optuna_study_name, space, study.sampler, opts.get("seed"),
                                  create=False)
        self.pruner = SlowBranchPruner(int(opts.get("warmup_steps", 3)), margin=float(opts.get("slow_margin", 0.25)),
                                       enabled=bool(opts.get("prune_slow", True)))
        legal = enumerate_legal(space, workload).configs
        answerable = backend_class(study.backend).answerable_layouts(study.backend_options)
        if answerable is not None:  # a replay table: spend the budget only on what it measured
            legal = [c for c in legal if c.key() in answerable]
        self.state = SearchState.build(workload, legal)
        self.running: dict[int, _Running] = {}
        headroom = opts.get("memory_headroom_gib")
        self.headroom_gib = default_headroom_gib(workload) if headroom is None else float(headroom)
        self.state.headroom_gib = self.headroom_gib
        self.controller_seconds = 0.0
        self.best_step_time_s: float | None = None
        self._last_heartbeat = 0.0
        self._exhausted = False
        self._restore()

    # --- restoring what the database knows ---------------------------------------------------

    def _restore(self) -> None:
        """Rebuild the search state from the study's recorded trials (for resume and joins)."""
        for trial in self.repo.trials(self.study.id):
            self._mark_tried(trial.config_key)
            self._learn(trial)
        self.state.dispatched = self.repo.counts(self.study.id)["dispatched"]

    def _mark_tried(self, key: str) -> None:
        i = self.state.index.get(key)
        if i is not None:
            self.state.tried[i] = True

    def _learn(self, trial: Trial) -> None:
        config = LayoutConfig.from_mapping(trial.config)
        if trial.status == "completed" and trial.tokens_per_s_per_gpu:
            self.state.record_speed(config, trial.tokens_per_s_per_gpu)
            self.state.record_memory(config, trial.peak_mem_gib, oom=False)
            if trial.step_time_s and (self.best_step_time_s is None or trial.step_time_s < self.best_step_time_s):
                self.best_step_time_s = trial.step_time_s
        elif trial.status == "oom":
            self.state.record_memory(config, trial.peak_mem_gib, oom=True)
            self.state.add_oom(config, trial.number)
        elif trial.status in ("failed", "timeout"):
            self.state.record_failure(config)

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> RunSummary:
        started = time.monotonic()
        self.repo.set_study_status(self.study.id, StudyStatus.RUNNING)
        self._reconcile_optuna()
        stop_reason = "budget"
        try:
            while True:
                self._heartbeat()
                self._adopt_stale()
                self._fill_slots()
                self._poll()
                self.on_tick(self)
                if not self.running and self._done():
                    break
            if self._exhausted and self.repo.counts(self.study.id)["dispatched"] < self.study.budget:
                stop_reason = "exhausted"
            validate_steps = int(self.study.options.get("validate_steps") or 0)
            if validate_steps > 0:
                self._validate(validate_steps)
        except KeyboardInterrupt:
            stop_reason = "interrupted"
            for number in list(self.running):
                self.dispatcher.cancel(number)
            self.repo.set_study_status(self.study.id, StudyStatus.INTERRUPTED)
            raise
        finally:
            self.dispatcher.shutdown()
        counts = self.repo.counts(self.study.id)
        finished = counts["running"] == 0 and (counts["dispatched"] >= self.study.budget or stop_reason == "exhausted")
        self.repo.set_study_status(self.study.id, StudyStatus.FINISHED if finished else StudyStatus.INTERRUPTED)
        return self.summary(time.monotonic() - started, stop_reason)

    def summary(self, elapsed_s: float, stop_reason: str) -> RunSummary:
        trials = self.repo.trials(self.study.id, dispatched_only=True)
        pick = recommend(trials, self.workload.cluster.gpu.memory_gib, self.headroom_gib)
        baseline = next((t for t in trials if t.strategy_note == "baseline"), None)
        counts = self.repo.counts(self.study.id)
        per_trial = self.controller_seconds / max(1, counts["dispatched"])
        return RunSummary(self.study.name, counts, pick.trial if pick else None, baseline, elapsed_s, per_trial,
                          stop_reason, pick)

    def _done(self) -> bool:
        """Nothing of ours runs: stop when the study is complete, or when we have nothing left to
        propose; wait (and adopt stale trials) while other controllers' trials still run."""
        counts = self.repo.counts(self.study.id)
        if counts["running"] == 0 and (counts["dispatched"] >= self.study.budget or self._exhausted):
            return True
        if self._exhausted and counts["dispatched"] < self.study.budget:
            return True  # the space is used up; other controllers' trials are theirs to finish
        if counts["dispatched"] >= self.study.budget:
            time.sleep(min(1.0, HEARTBEAT_S / 2))  # only other controllers' trials still run
        return False

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat < HEARTBEAT_S:
            return
        self._last_heartbeat = now
        self.repo.controller_heartbeat(self.study.id, self.controller_id)
        self.repo.heartbeat_trials(self.study.id, list(self.running))
        self._reconcile_optuna()  # proposals of a controller that died meanwhile, once they are stale

    # --- dispatch ------------------------------------------------------------------------------

    def _fill_slots(self) -> None:
        while self.dispatcher.free_slots() > 0 and not self._exhausted:
            if self.repo.counts(self.study.id)["dispatched"] >= self.study.budget:
                return  # checked before asking Optuna; claim_dispatch still guards against races
            tick = time.perf_counter()
            dispatched = self._dispatch_one()
            self.controller_seconds += time.perf_counter() - tick
            if not dispatched:
                return

    def _dispatch_one(self) -> bool:
        """Propose until one layout is dispatched; False when the budget or the space is used up."""
        for _ in range(MAX_REJECTIONS_PER_DISPATCH):
            proposal = self._propose()
            if proposal is None:
                self._exhausted = True
                return False
            number, config, note = proposal
            rejection = None if note == REMEASURE else self._screen(config)
            if rejection is not None:
                self._reject(number, config, note, *rejection)
                continue
            predicted = self._prediction(config)
            runs = len(self.state.runs.get(self.state.index.get(config.key(), -1), []))
            dispatch_key = f"{config.key()}#run{runs + 1}" if note == REMEASURE else None
            claimed = self.repo.claim_dispatch(self.study.id, config.to_dict(), config.key(), number,
                                               self.controller_id, self.study.budget, predicted, note,
                                               dispatch_key=dispatch_key)
            self._mark_tried(config.key())
            if claimed == ClaimRefused.BUDGET:
                self.optuna.tell_fail(number, "not dispatched: the study's budget is used up")
                self._exhausted = True
                return False
            if claimed == ClaimRefused.DUPLICATE:  # checked under the study's lock, so also across controllers
                self._reject(number, config, note, "duplicate", "already dispatched in this study", 1.0, None)
                continue
            self._submit(claimed, config)
            return True
        self._exhausted = True
        return False

    def _propose(self) -> tuple[int, LayoutConfig, str] | None:
        proposal: Proposal | None = self.strategy.propose(self.state)
        if proposal is None:
            return None
        self._record_skips(proposal)
        number, config = self.optuna.ask(proposal.config)
        return number, config, proposal.note

    def _record_skips(self, proposal: Proposal) -> None:
        """Record the OOM-frontier layouts the model ranked above the chosen one, with their source trial."""
        i = self.state.index.get(proposal.config.key())
        if i is None:
            return
        speed = self.state.log_prior  # the prior ranking: what a model-only search would have run
        skipped = np.flatnonzero(~self.state.tried & (self.state.frontier_by >= 0) & (speed > speed[i]))
        rows = []
        for j in skipped[:200]:
            config = self.state.legal[j]
            source = int(self.state.frontier_by[j])
            rows.append({"config": config.to_dict(), "config_key": config.key(), "reason": "oom_frontier",
                         "message": f"needs at least the memory of trial {source}, which ran out of memory",
                         "implied_by_trial": source, "strategy_note": proposal.note})
            self.state.tried[j] = True
        self.repo.add_rejected_many(self.study.id, rows)

    def _screen(self, config: LayoutConfig) -> tuple[str, str, float, int | None] | None:
        """(reason, message, constraint value, implying trial) when `config` must not run."""
        bad = violations(config, self.workload)
        if bad:
            return bad[0].rule, "; ".join(v.message for v in bad), float(len(bad)), None
        policy = policy_violations(config, self.workload, self.space.policy)
        if policy:
            return policy[0].rule, policy[0].message, 1.0, None
        i = self.state.index.get(config.key())
        if i is None:
            return "outside_space", "not in the study's search space (a --fix or domain excludes it)", 1.0, None
        if self.state.frontier_by[i] >= 0:
            source = int(self.state.frontier_by[i])
            return "oom_frontier", f"needs at least the memory of trial {source}, which ran out of memory", 1.0, source
        limit = self.workload.cluster.gpu.memory_gib
        p_fit = float(self.state.p_fit()[i])
        if p_fit < P_FIT_REJECT:
            peak = self.state.predicted_peak_gib(i)
            return ("predicted_oom", f"predicted {peak:.1f} GiB of {limit:g} GiB (fits with probability {p_fit:.0%})",
                    max(peak - limit, 0.01), None)
        return None  # duplicates are found by claim_dispatch, under the study's lock

    def _reject(self, number: int, config: LayoutConfig, note: str, reason: str, message: str,
                constraint: float, implied_by: int | None) -> None:
        self._mark_tried(config.key())
        self.repo.add_rejected(self.study.id, config.to_dict(), config.key(), reason, message, number, implied_by,
                               strategy_note=note)
        kind = "memory" if "oom" in reason else "duplicate" if reason == "duplicate" else "legality"
        self.optuna.tell_infeasible(number, kind, constraint, f"{reason}: {message}")

    def _prediction(self, config: LayoutConfig) -> dict[str, Any]:
        i = self.state.index.get(config.key())
        p = self.state.predicted
        if i is None:
            e = estimate(self.workload, config)
            return {"step_time_s": e.step_time_s, "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
                    "peak_mem_gib": e.peak_mem_gib, "breakdown": e.breakdown}
        return {"step_time_s": float(p.step_time_s[i]), "tokens_per_s_per_gpu": float(p.tokens_per_s_per_gpu[i]),
                "peak_mem_gib": float(p.peak_mem_gib[i]), "mfu": float(p.mfu[i]),
                "breakdown": {k: float(v[i]) for k, v in p.breakdown_s.items()}}

    def _spec(self, trial: Trial, config: LayoutConfig) -> TrialSpec:
        opts, w = self.study.options, self.workload
        backend_options = dict(self.study.backend_options)
        if self.space.source and not self.space.source.endswith(f"{w.model.name}.yaml"):
            backend_options["space_source"] = self.space.source
        return TrialSpec(study=self.study.name, trial=trial.number, model=w.model.name, gpus=w.cluster.gpus,
                         gpus_per_node=w.cluster.gpus_per_node, gpu=w.cluster.gpu.name,
                         global_batch_size=w.global_batch_size, seq_length=w.seq_length, precision=w.precision,
                         config=config.to_dict(), overrides=layout_overrides(config, w), attempt=trial.attempt,
                         timeout_s=float(opts.get("trial_timeout_s", 3600)),
                         warmup_steps=int(opts.get("warmup_steps", 3)),
                         measured_steps=int(opts.get("measured_steps", 5)), seed=int(opts.get("seed") or 0),
                         backend_options=backend_options)

    def _submit(self, trial: Trial, config: LayoutConfig) -> None:
        if trial.attempt <= 1:
            self.state.dispatched += 1
        spec = self._spec(trial, config)
        self.dispatcher.submit(spec)
        self.running[trial.number] = _Running(trial, spec)

    # --- outcomes ------------------------------------------------------------------------------

    def _poll(self) -> None:
        for number, steps, outcome in self.dispatcher.poll(timeout_s=0.1):
            run = self.running.get(number)
            if run is None:
                continue
            tick = time.perf_counter()
            for step in steps:
                if not is_plausible_step(step.step_time_s):
                    continue  # a launcher's NaN / negative step must not steer the pruner
                run.steps.append(step.step_time_s)
                if self.pruner.should_prune(run.steps, self.best_step_time_s):
                    self.dispatcher.cancel(number)
            if outcome is not None:
                self._finish(run, outcome)
            self.controller_seconds += time.perf_counter() - tick
        self._watchdog()

    def _watchdog(self) -> None:
        """Cancel a trial that runs far past its timeout (a backend that failed to stop it)."""
        grace_s = 60.0
        for number, run in self.running.items():
            if time.monotonic() - run.started > run.spec.timeout_s + grace_s:
                self.dispatcher.cancel(number)

    def _finish(self, run: _Running, outcome: TrialOutcome) -> None:
        trial, number = run.trial, run.trial.number
        self.running.pop(number, None)  # an adopted trial was never ours
        gpu_seconds = outcome.wall_time_s * self.workload.cluster.gpus
        optuna_number = trial.optuna_trial_number
        if outcome.status == TrialStatus.LOST:
            if self.repo.worker_losses(self.study.id, number) + 1 < MAX_ATTEMPTS:
                self.repo.retry_trial(self.study.id, number, f"attempt {trial.attempt} lost: {outcome.error}",
                                      self.controller_id, gpu_seconds, worker_lost=True)
                retried = dataclasses.replace(trial, attempt=trial.attempt + 1)
                self._submit(retried, LayoutConfig.from_mapping(trial.config))
                return
            outcome = dataclasses.replace(outcome, status=TrialStatus.FAILED,
                                          error=f"lost on {trial.attempt} attempts: {outcome.error}")
        outcome, metrics = self._checked(outcome, LayoutConfig.from_mapping(trial.config))
        status = outcome.status.value
        reason = {"oom": "out_of_memory", "pruned": "slow_branch", "timeout": "timeout"}.get(status)
        if status == "failed":
            reason = "invalid_result" if (outcome.error or "").startswith(("impossible result", "invalid result")) \
                else "failed"
        if status == "pruned" and not run.steps:
            reason = "cancelled"
        self.repo.finish_trial(self.study.id, number, status, reason=reason, message=outcome.error,
                               metrics=metrics if status in ("completed", "oom") else
                               {"peak_mem_gib": metrics.get("peak_mem_gib")},
                               step_times_s=outcome.step_times_s or run.steps, gpu_seconds=gpu_seconds,
                               artifacts=outcome.artifacts)
        finished = dataclasses.replace(trial, status=status, step_time_s=metrics["step_time_s"],
                                       tokens_per_s_per_gpu=metrics["tokens_per_s_per_gpu"],
                                       peak_mem_gib=metrics["peak_mem_gib"])
        self._learn(finished)
        self._tell(optuna_number, status, metrics, outcome, run.steps)

    def _checked(self, outcome: TrialOutcome, config: LayoutConfig) -> tuple[TrialOutcome, dict]:
        """The outcome and its metrics (missing ones derived), or a failed outcome when the numbers
        are impossible (a hostile or broken launcher: see backends.validation)."""
        metrics = derive_metrics(outcome, self.workload, config)
        if outcome.status not in (TrialStatus.COMPLETED, TrialStatus.OOM):
            peak_ok = impossible_result("failed", {"peak_mem_gib": metrics["peak_mem_gib"]}, [], self.workload,
                                        config.tp) is None
            return outcome, {**metrics, "peak_mem_gib": metrics["peak_mem_gib"] if peak_ok else None}
        status = outcome.status.value  # what the launcher reported is named first, then what follows from it
        problem = (impossible_result(status, outcome.metrics(), outcome.step_times_s, self.workload, config.tp)
                   or impossible_result(status, metrics, outcome.step_times_s, self.workload, config.tp))
        if problem is None:
            return outcome, metrics
        failed = dataclasses.replace(outcome, status=TrialStatus.FAILED, step_times_s=[],
                                     error=f"impossible result ({problem}); reported status {outcome.status.value}")
        return failed, {key: None for key in metrics}

    def _tell(self, number: int | None, status: str, metrics: dict, outcome: TrialOutcome,
              step_times_s: list[float]) -> None:
        if number is None:
            return
        if status == "completed" and metrics["tokens_per_s_per_gpu"]:
            self.optuna.tell_complete(number, metrics["tokens_per_s_per_gpu"])
        elif status == "oom":
            limit = self.workload.cluster.gpu.memory_gib
            over = (metrics.get("peak_mem_gib") or limit * 1.01) - limit
            self.optuna.tell_infeasible(number, "memory", max(over, 0.01), "out of memory")
        elif status == "pruned":
            steps = step_times_s[self.pruner.warmup_steps:] or step_times_s
            value = None
            if steps:
                w = self.workload
                value = tokens_per_s_per_gpu(w.global_batch_size, w.seq_length, w.cluster.gpus,
                                             float(np.median(steps)))
            self.optuna.tell_pruned(number, step_times_s, value)
        else:
            self.optuna.tell_fail(number, f"{status}: {outcome.error or ''}")

    # --- validation ----------------------------------------------------------------------------

    def _validate(self, measured_steps: int) -> None:
        """Run the recommended layout (and the runner-up when the screening runs cannot tell them
        apart) once more with `measured_steps` steps, outside the budget (`--validate-steps`)."""
        from autotune.controller.strategies import run_noise_std

        trials = self.repo.trials(self.study.id, dispatched_only=True)
        pick = recommend(trials, self.workload.cluster.gpu.memory_gib, self.headroom_gib)
        if pick is None:
            return
        chosen = [pick.best]
        runner_up = pick.runner_up
        if runner_up is not None:
            gap = np.log(pick.best.mean_tokens_per_s_per_gpu / runner_up.mean_tokens_per_s_per_gpu)
            if gap <= 2 * run_noise_std(self.state) * np.sqrt(1 / pick.best.runs + 1 / runner_up.runs):
                chosen.append(runner_up)
        for result in chosen:
            config = LayoutConfig.from_mapping(result.trial.config)
            number, config = self.optuna.ask(config)
            claimed = self.repo.claim_dispatch(self.study.id, config.to_dict(), config.key(), number,
                                               self.controller_id, self.study.budget, self._prediction(config),
                                               VALIDATION, dispatch_key=f"{config.key()}#validation",
                                               outside_budget=True)
            if isinstance(claimed, ClaimRefused):  # validated before this controller resumed
                self.optuna.tell_fail(number, "validation run already recorded")
                continue
            run = self._spec(claimed, config)
            self.dispatcher.submit(dataclasses.replace(run, measured_steps=measured_steps))
            self.running[claimed.number] = _Running(claimed, run)
            while self.running:
                self._heartbeat()
                self._poll()
                self.on_tick(self)

    # --- recovery ------------------------------------------------------------------------------

    def _reconcile_optuna(self) -> None:
        """Optuna trials a dead controller left RUNNING: unrecorded proposals are failed, those whose
        autotune trial already ended are told their outcome. Proposals of live controllers (younger
        than the staleness limit) are left alone (controller/_recovery.py)."""
        trials = {t.optuna_trial_number: t for t in self.repo.trials(self.study.id)
                  if t.optuna_trial_number is not None}
        for number, trial in abandoned(self.optuna.study, trials, STALE_AFTER_HEARTBEATS * HEARTBEAT_S):
            if trial is None:
                self.optuna.tell_fail(number, "the controller stopped before recording this proposal")
            elif trial.status == "rejected":
                self.optuna.tell_infeasible(number, "legality", 1.0, trial.reason or "rejected")
            else:
                outcome = TrialOutcome(trial.number, TrialStatus(trial.status), step_time_s=trial.step_time_s,
                                       peak_mem_gib=trial.peak_mem_gib, error=trial.message)
                self._tell(number, trial.status, {"tokens_per_s_per_gpu": trial.tokens_per_s_per_gpu,
                                                  "peak_mem_gib": trial.peak_mem_gib}, outcome, list(trial.step_times_s))

    def _adopt_stale(self) -> None:
        """Adopt trials whose controller stopped heartbeating and run them again.

        A controller's death says nothing about the layout, so this does not use up the one retry
        that a worker or node death gets (MAX_ATTEMPTS applies to those only).
        """
        if self.dispatcher.free_slots() == 0:
            return
        stale_s = STALE_AFTER_HEARTBEATS * HEARTBEAT_S
        cutoff = utcnow() - dt.timedelta(seconds=stale_s)
        for trial in self.repo.stale_trials(self.study.id, stale_s, self.controller_id):
            if self.dispatcher.free_slots() == 0:
                return
            if not self.repo.adopt_trial(self.study.id, trial.number, self.controller_id, cutoff):
                continue
            if self._harvest(trial):
                continue
            self.repo.retry_trial(self.study.id, trial.number, "re-run: its controller stopped while it ran",
                                  self.controller_id)
            retried = dataclasses.replace(trial, attempt=trial.attempt + 1, controller_id=self.controller_id)
            self._submit(retried, LayoutConfig.from_mapping(trial.config))

    def _harvest(self, trial: Trial) -> bool:
        """Record the outcome a run left in its run folder after its controller died (no second run)."""
        outcome = harvest(self.study.backend_options, self.study.name, trial.number, trial.attempt, trial.config)
        if outcome is None:
            return False
        config = LayoutConfig.from_mapping(trial.config)
        adopted = dataclasses.replace(trial, controller_id=self.controller_id)
        self._finish(_Running(adopted, self._spec(adopted, config)), outcome)
        return True
