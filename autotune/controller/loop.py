"""The controller: one process, the only writer of its trials to SQL and Optuna.

    propose (strategy) -> screening (legality, policy, OOM frontier, P(fit), already dispatched)
        rejected: recorded with its rule (numbered from REJECTED_BASE), not counted in the budget, and
                  no Optuna trial
        else:     an Optuna trial -> claim (budget, dedupe) -> recorded as dispatched (committed), numbered
                  with its Optuna trial number -> submitted to the dispatcher
    poll: step reports -> slow-branch pruner -> cancel
          outcome -> checked -> committed to SQL -> fed back to the search state -> told to Optuna

A trial whose controller died (its heartbeat went stale) is adopted by another controller: the
outcome its run left is recorded, or it is run again (a controller's death uses up no retry); a
trial lost to a dead worker or node is retried once, a second loss fails it. Several controllers
may share one study on PostgreSQL: the budget and "each layout dispatched once" are enforced by
the database (see storage.repository).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable


from autotune._signals import raise_if_terminated
from autotune.backends import TrialOutcome, TrialSpec, TrialStatus, backend_class
from autotune.backends.runs import harvest
from autotune._numbers import is_positive_finite, measured_terms
from autotune.backends.validation import METRIC_KEYS, possible_step, recheck
from autotune.config import LayoutConfig, Workload
from autotune.errors import OutputClosed, StorageError
from autotune.controller import _recovery, outcomes
from autotune.controller._optuna import OptunaStudy
from autotune.controller._spec import prediction, trial_spec
from autotune.controller.notes import BASELINE, REMEASURE
from autotune.controller.options import HEARTBEAT_S, STALE_AFTER_HEARTBEATS, StudyOptions
from autotune.controller.pruning import SlowBranchPruner
from autotune.controller.recommend import (Recommendation, backend_repeats_exactly, default_headroom_gib,
                                           pooled_cache_entry, recommend, validation_choices)
from autotune.controller.screening import DUPLICATE, Rejection, frontier_skips, screen
from autotune.controller.state import SearchState
from autotune.controller.strategies import Strategy
from autotune.space import SearchSpace, enumerate_legal
from autotune.storage import ClaimRefused, Repository, Study, StudyStatus, Trial, TrialNumbering, TrialOrigin
from autotune.storage.models import utcnow
from autotune.storage.repository import MAX_GPU_SECONDS_PER_ATTEMPT, GpuHourCap

if TYPE_CHECKING:
    from autotune.dispatch import Dispatcher

MAX_REJECTIONS_PER_DISPATCH = 2000
MAX_ATTEMPTS = 2  # a lost trial is retried once
# rounds of --validate-steps runs: a validation run that runs out of memory moves the recommendation, and the
# layout recommended then is validated in the next round (each round one or two runs outside the budget)
VALIDATION_ROUNDS = 3
WATCHDOG_GRACE_S = 60.0  # a trial running this long past its timeout is cancelled by the controller


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
    pruned_because: str | None = None  # SlowBranchPruner.why, when the controller cut it short


class Controller:
    def __init__(self, repo: Repository, study: Study, space: SearchSpace, workload: Workload,
                 strategy: Strategy, dispatcher: "Dispatcher", *, baseline: LayoutConfig | None = None,
                 on_tick: Callable[["Controller"], None] | None = None) -> None:
        self.repo, self.study, self.space, self.workload = repo, study, space, workload
        self.strategy, self.dispatcher, self.baseline = strategy, dispatcher, baseline
        self.on_tick = on_tick or (lambda _c: None)
        self.controller_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.options = opts = StudyOptions.from_stored(study.options)
        self.optuna = OptunaStudy(repo.url, study.optuna_study_name, space, study.sampler, opts.seed, create=False,
                                  backend=study.backend)
        # a run's number is its Optuna trial number, except in a study numbered before revision 0004
        self.numbered_by_optuna = study.numbering == TrialNumbering.OPTUNA
        self.pruner = SlowBranchPruner(opts.warmup_steps, margin=opts.slow_margin, enabled=opts.prune_slow)
        legal = enumerate_legal(space, workload).configs
        answerable = backend_class(study.backend).answerable_layouts(study.backend_options)
        if answerable is not None:  # a replay table: spend the budget only on what it measured
            legal = [c for c in legal if c.key() in answerable]
        self.state = SearchState.build(workload, legal)
        self.state.answerable = answerable  # the knob phase proposes only the variants the table holds
        self.running: dict[int, _Running] = {}
        self.headroom_gib = (default_headroom_gib(workload) if opts.memory_headroom_gib is None
                             else float(opts.memory_headroom_gib))
        self.state.headroom_gib = self.headroom_gib
        self.controller_seconds = 0.0
        self.best_step_time_s: float | None = None
        self._last_heartbeat = 0.0
        self._exhausted = False
        self._capped = False  # the GPU-hour cap is spent: no run starts (_fill_slots)
        self._first_run_gpu_s: float | None = None  # a run's GPU time forecast before any ended (_cap_reached)
        self._settled: set[int] = set()  # trial numbers whose outcome the search state has learnt
        self._others_in_flight: list[str] = []  # config keys of other controllers' runs in flight
        self._sync_others(dispatched_only=False)  # resume / join: the search state from the record

    def _sync_others(self, dispatched_only: bool = True) -> None:
        """Learn what the record holds that this controller did not run itself: at start (resume, join:
        every row, rejected layouts too) and at every heartbeat (the runs only: a study may record
        thousands of rejections, and screening here rejects the same layouts again), the outcomes other
        controllers of the study recorded since, and their runs in flight (believed by the search like
        this controller's own)."""
        in_flight = []
        for trial in self.repo.trials(self.study.id, dispatched_only=dispatched_only):
            if trial.number in self._settled or trial.number in self.running:
                continue
            self.state.mark_tried(trial.config_key)
            if trial.status == "dispatched":
                in_flight.append(trial.config_key)
                continue
            self._learn(trial)
            self._settled.add(trial.number)
        self._others_in_flight = in_flight
        self.state.dispatched = self.repo.counts(self.study.id)["dispatched"]

    def _learn(self, trial: Trial) -> None:
        config = LayoutConfig.from_mapping(trial.config)
        if trial.status == "completed" and trial.tokens_per_s_per_gpu:
            self.state.record_speed(config, trial.tokens_per_s_per_gpu, trial.measured_terms_s)
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
        from threadpoolctl import threadpool_limits

        # The search's linear algebra works on small matrices (tens of runs against a few thousand
        # candidate layouts): BLAS threads cost more than they save there (64 GPUs, 2 cores: 89 -> 45 ms
        # of controller time per trial with one thread).
        with threadpool_limits(limits=1):
            return self._run()

    def _run(self) -> RunSummary:
        started = time.monotonic()
        stop_reason = "budget"
        try:
            self.repo.set_study_status(self.study.id, StudyStatus.RUNNING)
            # at once: a study resumed after a kill still holds the dead controller's heartbeat, which readers
            # would take for this controller being silent until the loop's first heartbeat
            self.repo.controller_heartbeat(self.study.id, self.controller_id)
            self._reconcile_optuna()  # inside: a broken Optuna table left the study `running` (review)
            while True:
                raise_if_terminated()  # a SIGTERM whose exception a finalizer swallowed
                self._heartbeat()
                self._adopt_stale()
                self._fill_slots()
                self._poll()
                self.on_tick(self)
                if not self.running and self._done():
                    break
            if self._exhausted and self.repo.counts(self.study.id)["dispatched"] < self.study.budget:
                stop_reason = "exhausted"
            if self.options.validate_steps > 0 and not self._capped:
                raise_if_terminated()  # not validation runs of a study a swallowed SIGTERM stopped
                self._validate()
            if self._capped:  # runs of the budget, or validation runs, the cap kept from starting
                stop_reason = "gpu_hours"
        except (KeyboardInterrupt, BrokenPipeError) as exc:
            # a broken pipe: the output the user read from (`autotune start | head`) is gone; the study
            # stops as after Ctrl-C, `resume` continues it (review: it was left `running`, a run stuck)
            stop_reason = "interrupted"
            self._stop_running()
            if isinstance(exc, BrokenPipeError):  # told apart from a pipe that breaks after the study ended
                raise OutputClosed(str(exc)) from exc
            raise
        except Exception:
            # found by the storage pass: a study stopped by an error (a store refusing a write, a lost Optuna
            # study) stayed `running` with its runs dispatched until their heartbeat went stale. Stopped as
            # after Ctrl-C where the store still answers; the error is what the user must hear of, not this.
            self._stop_running(best_effort=True)
            raise
        finally:
            self.dispatcher.shutdown()
        counts = self.repo.counts(self.study.id)
        finished = counts["running"] == 0 and (counts["dispatched"] >= self.study.budget
                                               or stop_reason in ("exhausted", "gpu_hours"))
        self.repo.set_study_status(self.study.id, StudyStatus.FINISHED if finished else StudyStatus.INTERRUPTED)
        return self.summary(time.monotonic() - started, stop_reason)

    def _stop_running(self, best_effort: bool = False) -> None:
        """Cancel the runs in flight and mark them and the study stopped (`resume` continues it). `best_effort`
        (after an error): each step is tried whatever the others did (review: a cancel that raised, Ray gone,
        left the study `running`), and none raises."""
        numbers = list(self.running)
        gpus = self.workload.cluster.gpus
        # the GPU time each stopped attempt held, on this machine's clock (review: it was never counted)
        held = {n: min(MAX_GPU_SECONDS_PER_ATTEMPT, (time.monotonic() - run.started) * gpus)
                for n, run in self.running.items()}
        steps = [*(lambda n=n: self.dispatcher.cancel(n) for n in numbers),
                 # shown stopped at once, not `running` until their heartbeat went stale (review)
                 lambda: self.repo.release_trials(self.study.id, numbers, held),
                 lambda: self.repo.set_study_status(self.study.id, StudyStatus.INTERRUPTED)]
        for step in steps:
            if not best_effort:
                step()
                continue
            with contextlib.suppress(Exception):
                step()

    def summary(self, elapsed_s: float, stop_reason: str) -> RunSummary:
        trials = self.repo.trials(self.study.id, dispatched_only=True)
        pooled_estimate = not backend_repeats_exactly(self.study.backend)
        pick = recommend(trials, self.workload.cluster.gpu.memory_gib, self.headroom_gib,
                         pooled_estimate=pooled_estimate)
        if pooled_estimate and pick is not None:
            # stored, so that the readers of the finished study (status, leaderboard, show, export, the
            # dashboard) find the pooling done and need not fit the GP, nor import scikit-learn (~2.5 s)
            try:
                self.repo.set_pooled_cache(self.study.id, pooled_cache_entry(trials))
            except StorageError:  # a cache: the study ended all the same, and readers pool afresh
                pass
        baseline = next((t for t in trials if t.strategy_note == BASELINE), None)
        counts = self.repo.counts(self.study.id)
        per_trial = self.controller_seconds / max(1, counts["dispatched"])
        return RunSummary(self.study.name, counts, pick.trial if pick else None, baseline, elapsed_s, per_trial,
                          stop_reason, pick)

    def _done(self) -> bool:
        """Nothing of ours runs: stop when the study is complete, or when we have nothing left to
        propose; wait (and adopt stale trials) while other controllers' trials still run.

        The space or the GPU-hours used up is waited out as the budget is: another controller's run may be a dead
        one's, which only a controller still here adopts once its heartbeat goes stale (the last note: one that
        had used up the space left at once, and the study ended interrupted with the dead run `dispatched`)."""
        counts = self.repo.counts(self.study.id)
        budget_used = counts["dispatched"] >= self.study.budget
        nothing_to_start = budget_used or self._exhausted or self._capped
        if counts["running"] == 0 and nothing_to_start:
            # the space used up here, but another controller's run ended moments ago: it may be proposing its next
            # (this controller's Optuna proposals are not its), so wait a little more for one to adopt
            proposing_elsewhere = not (budget_used or self._capped) and _recovery.others_ended_lately(
                self.repo.trials(self.study.id, dispatched_only=True), self.controller_id,
                STALE_AFTER_HEARTBEATS * HEARTBEAT_S)
            if not proposing_elsewhere:
                return True
        if nothing_to_start:
            time.sleep(min(1.0, HEARTBEAT_S / 2))  # only other controllers' trials still run, or may start
        return False

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat < HEARTBEAT_S:
            return
        self._last_heartbeat = now
        self.repo.controller_heartbeat(self.study.id, self.controller_id)
        self.repo.heartbeat_trials(self.study.id, list(self.running))
        self._sync_others()  # what the study's other controllers measured since
        self._reconcile_optuna()  # proposals of a controller that died meanwhile, once they are stale

    # --- dispatch ------------------------------------------------------------------------------

    def _cap_reached(self) -> bool:
        """No run may start now: the GPU time the study's runs held (validation runs included) and that of its runs
        in flight under a live controller, counted at the mean of the runs that ended (before any has, at the cost
        forecast's run), reach its --max-gpu-hours (review: with four slots a 3 GPU-hour cap started 5 runs, 9.2
        GPU-hours; a run in flight had counted nothing). With nothing in flight that is the cap spent for good:
        _capped, which ends the dispatch of budget and validation runs alike; with runs in flight, a later check
        may find room (one ended early)."""
        cap = self._gpu_cap()
        if cap is None:
            return False
        reached, live = self.repo.cap_reached(self.study.id, cap)
        if live == 0:
            self._capped = reached
        return reached

    def _gpu_cap(self) -> GpuHourCap | None:
        """The study's --max-gpu-hours as _cap_reached and claim_dispatch check it (None: no cap). The first
        run's forecast is taken before the first dispatch, while the recipe's layout is open (review)."""
        if self.options.max_gpu_hours is None:
            return None
        return GpuHourCap(self.options.max_gpu_hours, self._forecast_run_gpu_s(),
                          utcnow() - dt.timedelta(seconds=STALE_AFTER_HEARTBEATS * HEARTBEAT_S))

    def _forecast_run_gpu_s(self) -> float:
        """GPU-seconds a run in flight counts for before any run of the study has ended: the cost forecast's run
        (controller/forecast.py, what `start` and `resume` printed: taken at the first check, before a run is
        dispatched; once the recipe's layout has run the forecast prices another). Review: a cap below one round's
        hours started the whole first round (four slots, a 2 GPU-hour cap: four runs of 1.8), as a run in flight
        counted nothing until one had ended."""
        if self._first_run_gpu_s is None:
            from autotune.controller.forecast import forecast

            estimate = forecast(self.state, self.baseline, 1, self.options, backend_class(self.study.backend),
                                self.study.backend_options)
            self._first_run_gpu_s = estimate.run_s * estimate.gpus
        return self._first_run_gpu_s

    def _fill_slots(self) -> None:
        while self.dispatcher.free_slots() > 0 and not self._exhausted and not self._capped:
            used = self.repo.counts(self.study.id)["dispatched"]
            if used >= self.study.budget:
                return  # checked before asking Optuna; claim_dispatch still guards against races
            if self._cap_reached():  # no new run; those in flight finish (their hours count: README)
                return
            # the budget used so far, other controllers' runs included (the strategies plan by it)
            self.state.dispatched = used
            tick = time.perf_counter()
            dispatched = self._dispatch_one()
            self.controller_seconds += time.perf_counter() - tick
            if not dispatched:
                return

    def _dispatch_one(self) -> bool:
        """Propose until one layout is dispatched; False when the budget or the space is used up, or when
        the proposal must wait for a run in flight (this controller's or another's) to end."""
        # the runs in flight: the search proposes around them (strategies.BELIEVE_PENDING), not beside them
        in_flight = {r.trial.config_key for r in self.running.values()} | set(self._others_in_flight)
        self.state.set_pending(in_flight)
        for _ in range(MAX_REJECTIONS_PER_DISPATCH):
            proposal = self.strategy.propose(self.state)
            if proposal is None:
                break
            if proposal.note == REMEASURE and proposal.config.key() in in_flight:
                # its last run is still running, here or at another controller: the strategy counts runs
                # only when they end and would name the same run again until this loop gave up (another
                # controller's run: a rejected duplicate each time). Wait for a result instead: on the
                # tuning seeds, proposing another contender or a new layout at once measured 0.9720
                # against 0.9755 waiting (four runs in flight, search_quality.last.txt)
                return False
            self.repo.add_rejected_many(self.study.id, frontier_skips(self.state, proposal.config, proposal.note))
            config, note = proposal.config, proposal.note
            runs = len(self.state.runs.get(self.state.index.get(config.key(), -1), []))
            dispatch_key = f"{config.key()}#run{runs + 1}" if note == REMEASURE else config.key()
            rejection = None if note == REMEASURE else screen(config, self.workload, self.space, self.state)
            if rejection is None and self.repo.is_dispatched(self.study.id, dispatch_key):
                rejection = DUPLICATE  # e.g. by another controller: found before it becomes an Optuna trial
            if rejection is not None:
                self._reject(config, note, rejection)
                continue
            number = self.optuna.ask(config)
            claimed = self.repo.claim_dispatch(self.study.id, config.to_dict(), config.key(), number,
                                               self.controller_id, self.study.budget,
                                               prediction(self.state, self.workload, config), note,
                                               dispatch_key=dispatch_key, number=self._number(number),
                                               cap=self._gpu_cap())
            if claimed == ClaimRefused.CAP:  # another controller's run took the last room under the cap since the check
                self.optuna.tell_fail(number, {"status": "not_dispatched", "reason": "cap",
                                               "message": "the study's GPU-hour cap was reached by its other runs"})
                self._cap_reached()  # with nothing in flight any more, the cap is spent for good (_capped)
                return False
            self.state.mark_tried(config.key())
            if claimed == ClaimRefused.BUDGET:  # another controller took the last of it since the check above
                self.optuna.tell_fail(number, {"status": "not_dispatched", "reason": "budget",
                                               "message": "the study's budget was used up by another controller"})
                break
            if claimed == ClaimRefused.DUPLICATE:  # a race with another controller, lost under the study's lock
                self._reject(config, note, DUPLICATE, number)
                continue
            self._submit(claimed, config)
            return True
        self._exhausted = True
        return False

    def _number(self, optuna_number: int) -> int | None:
        """The number of a run's row: its Optuna trial number (None: the next free one, in a study
        numbered before revision 0004)."""
        return optuna_number if self.numbered_by_optuna else None

    def _reject(self, config: LayoutConfig, note: str, rejection: Rejection, optuna_number: int | None = None) -> None:
        """Record a layout rejected before dispatch. It has an Optuna trial (`optuna_number`) only when it
        lost a race for its claim to another controller; that trial is told PRUNED with its constraint."""
        self.state.mark_tried(config.key())
        trial = self.repo.add_rejected(self.study.id, config.to_dict(), config.key(), rejection.reason,
                                       rejection.message, optuna_number, rejection.implied_by, strategy_note=note)
        outcomes.tell(self.optuna, optuna_number, trial.status, {}, rejection.message, [], self.workload,
                      self.pruner.warmup_steps, reason=rejection.reason, origin=trial.origin, strategy=note)

    def _submit(self, trial: Trial, config: LayoutConfig) -> None:
        spec = self._spec(trial, config)
        self.dispatcher.submit(spec)
        self.running[trial.number] = _Running(trial, spec)

    def _spec(self, trial: Trial, config: LayoutConfig) -> TrialSpec:
        """The run's spec; a validation run's steps and timeout (from its layout's slowest screening step) also
        when a lost or adopted validation run goes again."""
        if trial.origin != TrialOrigin.VALIDATION:
            return trial_spec(self.study, self.space, self.workload, self.options, trial.number, trial.attempt, config)
        steps = [t.step_time_s for t in self.repo.trials(self.study.id, dispatched_only=True)
                 if t.config_key == trial.config_key and t.origin != TrialOrigin.VALIDATION
                 and t.status == "completed" and is_positive_finite(t.step_time_s)]
        return trial_spec(self.study, self.space, self.workload, self.options, trial.number, trial.attempt, config,
                          validation=True, screening_step_s=max(steps) if steps else None)

    # --- outcomes ------------------------------------------------------------------------------

    def _poll(self) -> None:
        for number, steps, outcome in self.dispatcher.poll(timeout_s=0.1):
            run = self.running.get(number)
            if run is None:
                continue
            tick = time.perf_counter()
            for step in steps:
                if not possible_step(step.step_time_s, self.workload, int(run.trial.config.get("tp", 1))):
                    continue  # a launcher's NaN, negative or impossible step must not steer the pruner
                run.steps.append(step.step_time_s)
                # a validation run measures the recommendation, however slow beside the fastest run (which may be
                # a layout that ran out of memory or peaked in the margin): never cut short (found by review)
                if run.trial.origin != TrialOrigin.VALIDATION and \
                        self.pruner.should_prune(run.steps, self.best_step_time_s):
                    run.pruned_because = run.pruned_because or self.pruner.why(run.steps, self.best_step_time_s)
                    self.dispatcher.cancel(number)
            if outcome is not None:
                self._finish(run, outcome)
            self.controller_seconds += time.perf_counter() - tick
        for number, run in self.running.items():  # a backend that failed to enforce its timeout
            if time.monotonic() - run.started > run.spec.timeout_s + WATCHDOG_GRACE_S:
                self.dispatcher.cancel(number)

    def _finish(self, run: _Running, outcome: TrialOutcome) -> None:
        trial, number = run.trial, run.trial.number
        self.running.pop(number, None)  # an adopted trial was never ours
        self._settled.add(number)
        # a backend's (or a harvested outcome file's) wall time: no run held its GPUs past the watchdog
        wall_s = outcome.wall_time_s if is_positive_finite(outcome.wall_time_s) else 0.0
        gpu_seconds = min(min(wall_s, run.spec.timeout_s + WATCHDOG_GRACE_S) * self.workload.cluster.gpus,
                          MAX_GPU_SECONDS_PER_ATTEMPT)  # what the store takes (a decade's timeout on 10**9 GPUs)
        if outcome.status == TrialStatus.LOST:
            if self.repo.worker_losses(self.study.id, number) + 1 < MAX_ATTEMPTS:
                self.repo.retry_trial(self.study.id, number, f"attempt {trial.attempt} lost: {outcome.error}",
                                      self.controller_id, gpu_seconds, worker_lost=True)
                self._submit(dataclasses.replace(trial, attempt=trial.attempt + 1),
                             LayoutConfig.from_mapping(trial.config))
                return
            outcome = dataclasses.replace(outcome, status=TrialStatus.FAILED,
                                          error=f"lost on {trial.attempt} attempts: {outcome.error}")
        predicted = trial.predicted.get("peak_mem_gib") if isinstance(trial.predicted, dict) else None
        outcome, metrics = outcomes.checked(outcome, self.workload, LayoutConfig.from_mapping(trial.config), predicted)
        status = outcome.status.value
        if status == "pruned" and run.pruned_because:  # the pruner's figures, not the backend's "cancelled"
            outcome = dataclasses.replace(outcome, error=run.pruned_because)
        reason = outcomes.verdict(status, outcome.error, bool(run.steps))
        stored = metrics if status in ("completed", "oom") else {"peak_mem_gib": metrics.get("peak_mem_gib")}
        self.repo.finish_trial(self.study.id, number, status, reason=reason, message=outcome.error, metrics=stored,
                               step_times_s=outcome.step_times_s or run.steps, gpu_seconds=gpu_seconds,
                               artifacts=outcome.artifacts, measured_terms_s=outcome.measured_terms_s)
        # what the store kept (the measured parts only when they fit in the measured step)
        terms = (measured_terms(outcome.measured_terms_s, metrics["step_time_s"])
                 if status == "completed" and metrics["step_time_s"] else None)
        self._learn(dataclasses.replace(trial, status=status, step_time_s=metrics["step_time_s"],
                                        tokens_per_s_per_gpu=metrics["tokens_per_s_per_gpu"],
                                        peak_mem_gib=metrics["peak_mem_gib"], measured_terms_s=terms))
        outcomes.tell(self.optuna, trial.optuna_trial_number, status, stored, outcome.error, run.steps,
                      self.workload, self.pruner.warmup_steps, reason=reason, origin=trial.origin,
                      strategy=trial.strategy_note)

    # --- after the budget: validation runs of the winner (--validate-steps) ---------------------

    def _validate(self) -> None:
        """Run the recommended layout (and the runner-up when the screening runs cannot tell them
        apart) once more with options.validate_steps steps, outside the budget; again for the layout recommended
        then when a validation run moved the recommendation (its longer run ran out of memory) to a layout no
        validation ran, for at most VALIDATION_ROUNDS rounds (found by review: the study then recommended a
        layout it had never validated, and a resumed study validated other layouts than an uninterrupted one).
        Each round first waits for every validation run in flight, another controller's included, and runs
        again one whose controller died (found by review: a controller finished the study while another's
        validation run ran, and a dead controller's stayed `dispatched` in a finished study)."""
        for _ in range(2 * VALIDATION_ROUNDS):  # a bound the rule below keeps well within
            self._wait_for_validation_runs()
            if self._capped:
                return
            trials = self.repo.trials(self.study.id, dispatched_only=True)
            validations = [t for t in trials if t.origin == TrialOrigin.VALIDATION]
            # rounds counted from the store, so a resumed controller (or another one) gets no fresh ones: after
            # the first, a round follows an OOM only
            if validations and sum(t.status == "oom" for t in validations) >= VALIDATION_ROUNDS:
                return
            pick = recommend(trials, self.workload.cluster.gpu.memory_gib, self.headroom_gib,
                             pooled_estimate=not backend_repeats_exactly(self.study.backend))
            # the screening runs' noise (the leaderboard's): the state's counts the validation runs as repeats,
            # which moved a later round's runner-up rule without any OOM (found by review)
            noise = pick.noise.log_std if pick is not None and pick.noise is not None else self.state.run_noise()
            todo = [r for r in validation_choices(pick, noise)
                    if not self.repo.is_dispatched(self.study.id, _validation_key(r))]
            if not todo:
                return
            self._validate_round(todo)
        self._wait_for_validation_runs()  # the last round's runs (review: it could return with one in flight)

    def _wait_for_validation_runs(self) -> None:
        """Return once no validation run of the study is in flight: this controller's end, another
        controller's are waited for (their outcome may move the recommendation) and adopted when that
        controller stops heartbeating (run again, or harvested when it finished meanwhile)."""
        while True:
            raise_if_terminated()  # a SIGTERM a finalizer swallowed: not another round (found by review)
            self._heartbeat()
            self._adopt_stale()
            self._poll()
            self.on_tick(self)
            if self.running:
                continue
            in_flight = [t for t in self.repo.trials(self.study.id, dispatched_only=True)
                         if t.origin == TrialOrigin.VALIDATION and t.status == "dispatched"]
            if not in_flight:
                return
            time.sleep(min(1.0, HEARTBEAT_S / 2))

    def _validate_round(self, choices: list) -> None:
        for result in choices:
            if self._cap_reached():  # a validation run is GPU time too (review: two started past the cap)
                return
            config = LayoutConfig.from_mapping(result.trial.config)
            dispatch_key = _validation_key(result)
            if self.repo.is_dispatched(self.study.id, dispatch_key):
                continue  # another controller validated it while this round's earlier run ran
            number = self.optuna.ask(config)
            claimed = self.repo.claim_dispatch(self.study.id, config.to_dict(), config.key(), number,
                                               self.controller_id, self.study.budget,
                                               prediction(self.state, self.workload, config),
                                               dispatch_key=dispatch_key, origin=TrialOrigin.VALIDATION,
                                               number=self._number(number), cap=self._gpu_cap())
            if claimed == ClaimRefused.CAP:  # another controller's run took the last room under the cap
                self.optuna.tell_fail(number, {"status": "not_dispatched", "reason": "cap",
                                               "message": "the study's GPU-hour cap was reached by its other runs"})
                return
            if isinstance(claimed, ClaimRefused):  # another controller validated it since the check above
                self.optuna.tell_fail(number, {"status": "not_dispatched", "reason": "duplicate",
                                               "message": "validation run already recorded"})
                continue
            self._submit(claimed, config)
            self._wait_for_validation_runs()

    # --- recovery (controller/_recovery.py) ------------------------------------------------------

    def _reconcile_optuna(self) -> None:
        def tell_trial(number: int, trial: Trial) -> None:
            metrics = {key: getattr(trial, key) for key in METRIC_KEYS}
            outcomes.tell(self.optuna, number, trial.status, metrics, trial.message, list(trial.step_times_s),
                          self.workload, self.pruner.warmup_steps, reason=trial.reason, origin=trial.origin,
                          strategy=trial.strategy_note)

        _recovery.reconcile(self.repo, self.study.id, self.optuna, STALE_AFTER_HEARTBEATS * HEARTBEAT_S, tell_trial)

    def _adopt_stale(self) -> None:
        """Adopt trials whose controller stopped heartbeating: record the outcome a run left behind,
        or run it again, into room under the GPU-hour cap (checked with the adoption, under the study row's
        lock, as a new run's claim is: _recovery.adoptable). A controller's death says nothing about the layout,
        so this does not use up the one retry that a worker or node death gets (MAX_ATTEMPTS applies to those
        only)."""
        if self.dispatcher.free_slots() == 0:
            return
        from autotune.storage import Adoption

        gpus = self.workload.cluster.gpus
        # the cap only for a trial that must run again (each pass of the loop comes here; its first-run forecast is
        # taken, as before, where the cap is first needed)
        for trial, outcome, adoption in _recovery.adoptable(
                self.repo, self.study.id, self.controller_id, STALE_AFTER_HEARTBEATS * HEARTBEAT_S,
                self.dispatcher.free_slots,
                outcome_of=lambda t: harvest(self.study.backend_options, self.study.name, t.number, t.attempt, t.config),
                rerun_cap=lambda t: (self._gpu_cap(), _held_until_silent(t, gpus))):
            config = LayoutConfig.from_mapping(trial.config)
            adopted = dataclasses.replace(trial, controller_id=self.controller_id)
            held = _held_until_silent(trial, gpus)
            if outcome is not None:  # it finished while its controller was dead: no second run
                spec = self._spec(trial, config)
                self._finish(_Running(adopted, spec), recheck(spec, outcome, held / gpus))
                continue
            if adoption is Adoption.CAP:
                # not run again past the GPU-hour cap: ended as a cancelled run, its time counted (review: let go, it
                # stayed dispatched, and the study hung or stayed interrupted with nothing that could run it)
                self._finish(_Running(adopted, self._spec(trial, config)), TrialOutcome(
                    trial.number, TrialStatus.PRUNED, wall_time_s=held / gpus,
                    error="not run again: the study's GPU-hour cap was spent (--max-gpu-hours)"))
                continue
            self.repo.retry_trial(self.study.id, trial.number, "re-run: its controller stopped while it ran",
                                  self.controller_id, gpu_seconds=held)
            self._submit(dataclasses.replace(adopted, attempt=trial.attempt + 1), config)


def _held_until_silent(trial: Trial, gpus: int) -> float:
    """GPU-seconds a dead controller's attempt held, as far as the store knows: from its dispatch to its last
    heartbeat (a released attempt has none: its controller counted it when it let go). Zero when either time is
    missing or they are out of order (another clock, a hand edit)."""
    if trial.heartbeat_at is None or trial.dispatched_at is None:
        return 0.0
    seconds = (trial.heartbeat_at - trial.dispatched_at).total_seconds()
    return min(MAX_GPU_SECONDS_PER_ATTEMPT, seconds * gpus) if 0 < seconds else 0.0


def _validation_key(result) -> str:
    """The dispatch key of a layout's --validate-steps run: one per layout and study (claim_dispatch)."""
    return f"{LayoutConfig.from_mapping(result.trial.config).key()}#validation"
