"""autotune's model-guided search as an Optuna sampler, for your own Optuna study.

    import optuna
    from autotune.controller.sampler import AutotuneSampler

    sampler = AutotuneSampler("qwen3_30b", gpus=16, budget=40, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)

    def objective(trial):
        layout = sampler.suggest_layout(trial)        # a legal LayoutConfig for this model and cluster
        result = my_launcher(layout)                  # your own run
        if result.out_of_memory:
            trial.set_user_attr("oom", True)          # the search learns the memory boundary from it
            trial.set_user_attr("peak_mem_gib", result.peak_mem_gib)
            raise optuna.TrialPruned()
        trial.set_user_attr("peak_mem_gib", result.peak_mem_gib)   # optional: calibrates memory
        return result.tokens_per_s_per_gpu

    study.optimize(objective, n_trials=40)

The sampler proposes the whole layout at once (a relative sample over every knob): the recipe's
layout first, then the same constrained expected improvement as `autotune start --sampler auto`
(controller/strategies.py), learning from every finished trial of the study; trials still running
(`study.optimize(..., n_jobs=4)`, or several processes sharing a storage) count as in flight: the next
proposal treats them as measured at what the search expects of them, so it does not copy them. A layout
may be proposed twice near the end of the budget: a re-measurement of a close contender (noise).

What it expects of the study, and refuses otherwise (one ValueError at the first proposal): one objective,
maximised, that is the run's tokens per second per GPU. `budget` is what the search plans for (its initial
design, when to re-measure); `n_trials` is Optuna's, and may be larger: once every legal layout that may fit
has run, the sampler proposes the best layouts measured again (legal layouts only, never Optuna's random
fallback over the knobs, which would break the legality rules). It tunes the layout knobs only (not the
performance knobs `autotune start` tunes after them). A trial pruned by an Optuna pruner teaches it nothing
(its layout is not proposed again) unless it sets the `oom` user attribute. A trial left RUNNING by a crashed
process counts as in flight until the storage fails it: use an RDB storage with a heartbeat
(`optuna.storages.RDBStorage(url, heartbeat_interval=60)`), whose stale trials Optuna fails.
"""

from __future__ import annotations

import operator
import threading
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.config import MAX_BUDGET, MAX_SEED, MAX_WORKLOAD_COUNT, LayoutConfig
from autotune.errors import ConfigError
from autotune.controller._optuna import config_of, distributions, params_of
from autotune.controller.state import SearchState
from autotune.controller.strategies import AutoStrategy
from autotune.space import load_space, make_workload


def _integer(name: str, value: Any) -> int | None:
    """An integer argument as an int (numpy's integers too: review), None kept; a bool or a float refused."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None


# the workload's keyword arguments (make_workload's, except those only a stored study gives)
WORKLOAD_KEYWORDS = ("gpus_per_node", "gpu", "global_batch_size", "seq_length", "precision", "network_gbps")


class AutotuneSampler(optuna.samplers.BaseSampler):
    """Optuna sampler over the legal layouts of one model on one cluster (see the module doc).

    ConfigError at construction when the model has no legal layout on that cluster, or none predicted to fit
    (as `autotune start` refuses such a study)."""

    def __init__(self, model: str, gpus: int | None = None, *, budget: int = 40, seed: int | None = None,
                 **workload: Any) -> None:
        from autotune.controller.session import check_some_layout_fits, check_space_not_empty

        # found by the storage pass's notes: the Python API's errors named CLI flags ("--gpus 12 is not a multiple
        # of --gpus-per-node 8"), an unknown keyword was make_workload's TypeError, and budget=0 was taken
        unknown = sorted(set(workload) - set(WORKLOAD_KEYWORDS))
        if unknown:
            raise TypeError(f"AutotuneSampler() got unexpected keyword argument(s) {', '.join(map(repr, unknown))} "
                            f"(the workload's are: {', '.join(WORKLOAD_KEYWORDS)})")
        budget, seed = _integer("budget", budget), _integer("seed", seed)
        gpus = _integer("gpus", gpus)
        for name in ("gpus_per_node", "global_batch_size", "seq_length"):
            workload[name] = _integer(name, workload.get(name))
        workload = {k: v for k, v in workload.items() if v is not None}
        if budget is None or not 0 < budget <= MAX_BUDGET:
            raise ConfigError(f"budget must be a positive number of trials up to {MAX_BUDGET:,}, got {budget!r}")
        if seed is not None and not 0 <= seed <= MAX_SEED:
            # numpy's and Optuna's samplers take 32-bit seeds (2**40 failed in numpy at the first proposal)
            raise ConfigError(f"seed must be None or an integer in [0, {MAX_SEED}], got {seed!r}")
        for name, value in {"gpus": gpus, **workload}.items():
            if isinstance(value, int) and value > MAX_WORKLOAD_COUNT:  # the CLI's bound: no cluster or batch is larger
                raise ConfigError(f"{name} must be at most {MAX_WORKLOAD_COUNT:,}, got {value}")
        space = load_space(model)
        self.space = space
        self.workload = make_workload(space, gpus=gpus, keyword_names=True, **workload)
        legal = check_space_not_empty(space, self.workload)
        check_some_layout_fits(self.workload, legal)
        self.state = SearchState.build(self.workload, legal)
        baseline = LayoutConfig.from_mapping(space.model.defaults.layout)
        self.strategy = AutoStrategy(budget, seed, baseline, space)
        self.distributions = distributions(space)
        self._fallback = optuna.samplers.RandomSampler(seed=seed)
        self._seen: set[int] = set()
        # this sampler's proposals by trial number: a trial's params reach the storage only when the objective
        # suggests them, so a proposal made a moment ago is in flight before the storage shows it (found by a
        # new-user pass: with n_jobs=2 both workers ran the same layout at once)
        self._proposed: dict[int, str] = {}
        self._lock = threading.Lock()  # Optuna calls the sampler from each n_jobs thread
        self._repeats = 0

    def suggest_layout(self, trial: optuna.trial.Trial) -> LayoutConfig:
        """Suggest every knob through `trial` and return the layout (what this sampler chose)."""
        params = {name: trial.suggest_categorical(name, dist.choices) for name, dist in self.distributions.items()}
        config = config_of(params)
        if config.key() not in self.state.index:
            # params fixed outside the sampler (study.enqueue_trial with part of a layout) over its proposal: the
            # mix may break a rule (review: enqueued tp=8 ran with the sampler's pp=4 on 8 GPUs)
            raise ValueError(f"the trial's layout {config.short()} is not legal for {self.workload.model.name} on "
                             f"{self.workload.cluster.gpus} GPUs (a study.enqueue_trial with part of a layout? "
                             "enqueue every knob of a legal layout)")
        return config

    # --- BaseSampler ---------------------------------------------------------------------------

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.distributions)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        _require_throughput_study(study)
        with self._lock:
            config = self._propose(study, trial)
            self._proposed[trial.number] = config.key()
            return params_of(config)

    def _propose(self, study: optuna.Study, trial: FrozenTrial) -> LayoutConfig:
        self._learn(study)
        # trials still running (study.optimize(n_jobs=...) or several workers): believed, not copied
        running = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.number == trial.number:
                continue
            if set(t.params) == set(self.distributions):
                running.append(config_of(t.params).key())
            elif t.number in self._proposed:  # proposed here, its params not suggested yet
                running.append(self._proposed[t.number])
        for key in running:  # another worker's proposal is not proposed again
            self.state.mark_tried(key)
        self.state.set_pending(running)
        self.state.dispatched = len(self._seen) + len(running)  # every worker's trials, not only this one's
        proposal = self.strategy.propose(self.state)
        if proposal is not None:
            self.state.mark_tried(proposal.config.key())
            return proposal.config
        return self._repeat()

    def _repeat(self) -> LayoutConfig:
        """Every legal layout that may fit has run (n_trials beyond the legal set): the best measured layouts
        again, in turn (a re-measurement under noise), else the recipe's or the best predicted one. Optuna's
        independent fallback drew each knob on its own and broke the legality rules (found by a new-user pass:
        14 of 40 trials of llama3_8b on 2 GPUs illegal, one of them reported as the best)."""
        import warnings

        means = self.state.measured_means()  # layout -> (mean log throughput, runs)
        order = sorted(means, key=lambda i: -means[i][0])[:3]
        if not order:  # nothing measured (every run failed): the recipe's layout, else the best predicted
            baseline = self.state.index.get(self.strategy.baseline.key()) if self.strategy.baseline else None
            order = [baseline if baseline is not None else int(self.state.predicted.tokens_per_s_per_gpu.argmax())]
        if self._repeats == 0:
            warnings.warn("AutotuneSampler: every legal layout that may fit has run; proposing the best measured "
                          "layouts again", stacklevel=3)
        choice = self.state.legal[order[self._repeats % len(order)]]
        self._repeats += 1
        return choice

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def _learn(self, study: optuna.Study) -> None:
        """Feed every trial finished since the last call into the search state."""
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
            if t.number in self._seen or set(t.params) != set(self.distributions):
                continue
            self._seen.add(t.number)
            self._proposed.pop(t.number, None)
            config = config_of(t.params)
            i = self.state.index.get(config.key())
            if i is None:
                continue
            self.state.tried[i] = True
            peak = t.user_attrs.get("peak_mem_gib")
            infeasible = t.user_attrs.get("oom") or any(v > 0 for v in (t.constraints or []))
            if infeasible:
                self.state.record_memory(config, peak, oom=True)
                self.state.add_oom(config, t.number)
            elif t.state == TrialState.COMPLETE and t.value is not None and t.value > 0:
                self.state.record_speed(config, float(t.value))
                self.state.record_memory(config, peak, oom=False)
            elif t.state == TrialState.FAIL:
                self.state.record_failure(config)
            # PRUNED by a pruner (slow, as the controller's pruner judges): tried, nothing learnt of its speed


def _require_throughput_study(study: optuna.Study) -> None:
    """ValueError unless `study` has one objective, maximised (found by a new-user pass: a minimize study was
    silently maximised, the search climbing toward slower layouts; a multi-objective one raised Optuna's own
    RuntimeError from inside the sampler)."""
    directions = study.directions
    if len(directions) != 1 or directions[0] != optuna.study.StudyDirection.MAXIMIZE:
        raise ValueError("AutotuneSampler maximises one objective, the run's tokens per second per GPU: create the "
                         "study with optuna.create_study(direction='maximize', ...) (this one: "
                         f"{', '.join(d.name.lower() for d in directions)})")
