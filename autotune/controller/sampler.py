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
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.config import LayoutConfig
from autotune.controller._optuna import config_of, distributions, params_of
from autotune.controller.state import SearchState
from autotune.controller.strategies import AutoStrategy
from autotune.space import enumerate_legal, load_space, make_workload


class AutotuneSampler(optuna.samplers.BaseSampler):
    """Optuna sampler over the legal layouts of one model on one cluster (see the module doc)."""

    def __init__(self, model: str, gpus: int | None = None, *, budget: int = 40, seed: int | None = None,
                 **workload: Any) -> None:
        space = load_space(model)
        self.space = space
        self.workload = make_workload(space, gpus=gpus, **workload)
        self.state = SearchState.build(self.workload, enumerate_legal(space, self.workload).configs)
        baseline = LayoutConfig.from_mapping(space.model.defaults.layout)
        self.strategy = AutoStrategy(budget, seed, baseline, space)
        self.distributions = distributions(space)
        self._fallback = optuna.samplers.RandomSampler(seed=seed)
        self._seen: set[int] = set()

    def suggest_layout(self, trial: optuna.trial.Trial) -> LayoutConfig:
        """Suggest every knob through `trial` and return the layout (what this sampler chose)."""
        params = {name: trial.suggest_categorical(name, dist.choices) for name, dist in self.distributions.items()}
        return config_of(params)

    # --- BaseSampler ---------------------------------------------------------------------------

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.distributions)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        self._learn(study)
        # trials still running (study.optimize(n_jobs=...) or several workers): believed, not copied
        running = [config_of(t.params).key() for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if t.number != trial.number and set(t.params) == set(self.distributions)]
        for key in running:  # another worker's proposal is not proposed again
            self.state.mark_tried(key)
        self.state.set_pending(running)
        self.state.dispatched = len(self._seen) + len(running)  # every worker's trials, not only this one's
        proposal = self.strategy.propose(self.state)
        if proposal is None:
            return {}  # the legal set is used up: Optuna's independent sampling takes over
        self.state.mark_tried(proposal.config.key())
        return params_of(proposal.config)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def _learn(self, study: optuna.Study) -> None:
        """Feed every trial finished since the last call into the search state."""
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
            if t.number in self._seen or set(t.params) != set(self.distributions):
                continue
            self._seen.add(t.number)
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
            else:
                self.state.record_failure(config)
