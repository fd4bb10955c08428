"""The one file that speaks Optuna. Optuna's study is the study of record for every dispatched trial.

Each knob is a categorical parameter over its domain; recompute is one parameter whose choices are
"none", "selective" and "full/<method>/<layers>". Model-guided strategies choose a layout and
enqueue it (`ask(config)`); strategies built on Optuna's samplers (TPE, GP) sample in a private study
of their own and enqueue their layouts the same way. Outcomes are told by
trial number, so a resumed controller can tell trials asked by the one that died:
completed -> COMPLETE(value); OOM and rejected -> PRUNED with a positive constraint (never FAIL,
which makes samplers propose the same layout again); slow -> PRUNED with its last value;
failed / timeout / lost twice -> FAIL.
"""

from __future__ import annotations

import logging
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from autotune.config import LayoutConfig
from autotune.space import SearchSpace
from autotune.storage import engine_kwargs

PLAIN_KNOBS = ("tp", "pp", "vpp", "cp", "ep", "etp", "sp", "mbs", "dist_opt")

optuna.logging.set_verbosity(optuna.logging.WARNING)
logging.getLogger("optuna").setLevel(logging.WARNING)


def recompute_label(config: LayoutConfig) -> str:
    if config.recompute == "full":
        return f"full/{config.recompute_method}/{config.recompute_num_layers}"
    return config.recompute


def recompute_choices(space: SearchSpace) -> list[str]:
    from autotune.space._enumerate import _recompute_variants

    return [recompute_label(LayoutConfig(recompute=g, recompute_method=m, recompute_num_layers=n))
            for g, m, n in _recompute_variants(space.domains)]


def distributions(space: SearchSpace) -> dict[str, CategoricalDistribution]:
    dists = {k: CategoricalDistribution(list(space.domains[k])) for k in PLAIN_KNOBS}
    dists["recompute"] = CategoricalDistribution(recompute_choices(space))
    return dists


def params_of(config: LayoutConfig) -> dict[str, Any]:
    values = config.to_dict()
    params = {k: values[k] for k in PLAIN_KNOBS}
    params["recompute"] = recompute_label(config)
    return params


def config_of(params: dict[str, Any]) -> LayoutConfig:
    values = {k: params[k] for k in PLAIN_KNOBS}
    label = params["recompute"]
    if label.startswith("full/"):
        _, method, layers = label.split("/")
        values.update(recompute="full", recompute_method=method, recompute_num_layers=int(layers))
    else:
        values["recompute"] = label
    return LayoutConfig.from_mapping(values)


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    # Every strategy (TPE and GP included, which sample in a private study of their own) fixes all
    # parameters of the layouts it proposes; the study of record's sampler then fills nothing.
    return optuna.samplers.RandomSampler(seed=seed)


class OptunaStudy:
    """Optuna's view of an autotune study, in the same database as autotune's tables."""

    def __init__(self, url: str, study_name: str, space: SearchSpace, sampler: str, seed: int | None,
                 create: bool) -> None:
        self.storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url))
        self.study = optuna.create_study(storage=self.storage, study_name=study_name, direction="maximize",
                                         sampler=make_sampler(sampler, seed), load_if_exists=not create)
        self.study_id = self.storage.get_study_id_from_name(study_name)
        self.distributions = distributions(space)
        self._ids: dict[int, int] = {}  # trial number -> storage id, for the trials this process asked

    def ask(self, config: LayoutConfig | None = None) -> tuple[int, LayoutConfig]:
        """A new trial: the sampler's suggestion, or `config` fixed when given.

        A fixed layout becomes a RUNNING trial with its parameters set in one storage call (the
        effect of enqueue_trial + ask, without scanning the study's waiting trials).
        """
        if config is None:
            trial = self.study.ask(self.distributions)
            return trial.number, config_of(trial.params)
        template = optuna.trial.create_trial(state=TrialState.RUNNING, params=params_of(config),
                                             distributions=self.distributions)
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=template)
        number = self.storage.get_trial_number_from_id(trial_id)
        self._ids[number] = trial_id
        return number, config

    def add_measured(self, config: LayoutConfig, value: float | None, oom: bool) -> int:
        """Record a run made outside the controller (an imported log) as a finished trial."""
        state = TrialState.COMPLETE if value is not None and not oom else TrialState.PRUNED
        system_attrs = {"constraints:memory": 1.0} if oom else {}
        frozen = optuna.trial.create_trial(state=state, value=value if state == TrialState.COMPLETE else None,
                                           params=params_of(config), distributions=self.distributions,
                                           system_attrs=system_attrs, user_attrs={"autotune_source": "imported log"})
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=frozen)
        return self.storage.get_trial_number_from_id(trial_id)

    def _trial(self, number: int) -> optuna.trial.Trial:
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        return optuna.trial.Trial(self.study, trial_id)

    def _finished(self, number: int) -> bool:
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        return self.storage.get_trial(trial_id).state.is_finished()

    def tell_complete(self, number: int, value: float, step_times_s: list[float] | None = None) -> None:
        # one storage write (Study.tell reads the trial twice first: ~10 ms per trial on SQLite); a trial
        # already finished (told by a controller before this one resumed) stays as it was
        trial_id = self._ids.get(number)
        if trial_id is None:
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        try:
            self.storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [float(value)])
        except optuna.exceptions.UpdateFinishedTrialError:
            pass

    def tell_infeasible(self, number: int, constraint: str, value: float, reason: str) -> None:
        """PRUNED with a positive constraint: OOM (measured or predicted) and illegal proposals."""
        if self._finished(number):
            return
        trial = self._trial(number)
        trial.set_constraint(constraint, max(float(value), 1e-6))
        trial.set_user_attr("autotune_reason", reason)
        self.study.tell(number, state=TrialState.PRUNED)

    def tell_pruned(self, number: int, step_times_s: list[float], value: float | None) -> None:
        if self._finished(number):
            return
        trial = self._trial(number)
        if value is not None:
            trial.report(value, step=max(1, len(step_times_s)))
        self.study.tell(number, state=TrialState.PRUNED)

    def tell_fail(self, number: int, reason: str) -> None:
        if self._finished(number):
            return
        self._trial(number).set_user_attr("autotune_reason", reason[:500])
        self.study.tell(number, state=TrialState.FAIL)

    def running_numbers(self) -> list[int]:
        return [t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,
                                                                                 TrialState.WAITING))]
