"""The one file that speaks Optuna. Optuna's study is the study of record for every run: each trial
dispatched (study and validation runs) or imported, and nothing else.

The Optuna study carries the autotune study's name, its objective is named `tokens_per_s_per_gpu`
(`set_metric_names`, shown by optuna-dashboard) and a study system attribute (OWNER_KEY) marks it as
autotune's. Each knob is a categorical parameter over its domain; recompute is one parameter whose
choices are "none", "selective" and "full/<method>/<layers>". Strategies choose a layout (TPE and GP
sample in a private study of their own) and the controller asks for it here (`ask(config)`) only once
screening let it through: a layout rejected before dispatch never becomes an Optuna trial. Outcomes
are told by trial number, so a resumed controller can tell trials asked by the one that died:
completed -> COMPLETE(value); OOM -> PRUNED with a positive constraint (never FAIL, which makes
samplers propose the same layout again); slow -> PRUNED with its last value; failed / timeout / lost
twice -> FAIL. Every trial's user attributes say what autotune knows of it: backend, `simulated`,
origin and strategy when asked; status, reason, message and the five metrics when told
(outcomes.optuna_attrs).
"""

from __future__ import annotations

import datetime as dt
import logging
import warnings
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from autotune.config import LayoutConfig
from autotune.errors import StudyError
from autotune.space import SearchSpace
from autotune.storage import engine_kwargs

PLAIN_KNOBS = ("tp", "pp", "vpp", "cp", "ep", "etp", "sp", "mbs", "dist_opt")
OBJECTIVE = "tokens_per_s_per_gpu"  # the study's one value, maximised
OWNER_KEY = "autotune:study"  # study system attribute: the autotune study that created this Optuna study

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


def _one_transaction_available() -> bool:
    """Whether this Optuna's RDB storage has the internals `_end_in_one_transaction` uses (Optuna 5.0 has;
    tests/controller/test_parts.py says when an upgrade takes them away)."""
    try:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session  # noqa: F401
    except ImportError:
        return False
    internals = ("_create_new_trial", "_set_trial_attr_without_commit", "_set_trial_value_without_commit",
                 "_set_trial_intermediate_value_without_commit")
    return all(hasattr(optuna.storages.RDBStorage, n) for n in internals) and hasattr(models.TrialModel,
                                                                                      "find_or_raise_by_id")


# A trial's start and end are one storage transaction each (creating a trial with its parameters and
# attributes, ending it with its state, value, attributes and constraint); through Optuna's public
# storage API the end takes one transaction per attribute, ~10 per trial.
ONE_TRANSACTION = _one_transaction_available()


def _make_room(storage: optuna.storages.RDBStorage, name: str) -> None:
    """Before creating the Optuna study `name`: delete one that autotune created for an autotune study
    that does not exist (a start that failed half-way); refuse one that autotune did not create."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return
    if storage.get_study_system_attrs(study_id).get(OWNER_KEY) != name:
        raise StudyError(f"the storage holds an Optuna study named {name!r} that autotune did not create: "
                         "choose another --study")
    storage.delete_study(study_id)


class OptunaStudy:
    """Optuna's view of an autotune study, in the same database as autotune's tables.

    `create` makes the Optuna study (`_make_room` first); otherwise it is loaded (made if missing).
    `backend` (the autotune study's) is written on every trial this object asks for or imports.
    """

    def __init__(self, url: str, study_name: str, space: SearchSpace, sampler: str, seed: int | None,
                 create: bool, backend: str | None = None) -> None:
        self.storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url))
        if create:
            _make_room(self.storage, study_name)
        self.study = optuna.create_study(storage=self.storage, study_name=study_name, direction="maximize",
                                         sampler=make_sampler(sampler, seed), load_if_exists=not create)
        self.study_id = self.storage.get_study_id_from_name(study_name)
        if create:
            self.storage.set_study_system_attr(self.study_id, OWNER_KEY, study_name)
            with warnings.catch_warnings():  # set_metric_names is experimental since Optuna 3.2
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self.study.set_metric_names([OBJECTIVE])
        self.distributions = distributions(space)
        self.trial_attrs = {"backend": backend, "simulated": backend == "simulate"} if backend else {}
        self._ids: dict[int, int] = {}  # trial number -> storage id, for the trials this process created

    def _create(self, template: optuna.trial.FrozenTrial) -> int:
        """Create a trial from `template` in one storage transaction; its number."""
        if ONE_TRANSACTION:
            created = self.storage._create_new_trial(self.study_id, template_trial=template)
            number, trial_id = created.number, created._trial_id
        else:
            trial_id = self.storage.create_new_trial(self.study_id, template_trial=template)
            number = self.storage.get_trial_number_from_id(trial_id)
        self._ids[number] = trial_id
        return number

    def ask(self, config: LayoutConfig, origin: str = "study", strategy: str | None = None) -> int:
        """A RUNNING trial with `config` as its parameters (the effect of enqueue_trial + ask, in one
        storage transaction); its number. Ask only for a layout that is about to be dispatched."""
        attrs = {**self.trial_attrs, "origin": origin, **({"strategy": strategy} if strategy else {})}
        return self._create(optuna.trial.create_trial(state=TrialState.RUNNING, params=params_of(config),
                                                      distributions=self.distributions, user_attrs=attrs))

    def add_measured(self, config: LayoutConfig, value: float | None, oom: bool, attrs: dict[str, Any]) -> int:
        """Record a run made outside the controller (an imported log) as a finished trial; its number."""
        state = TrialState.COMPLETE if value is not None and not oom else TrialState.PRUNED
        system_attrs = {"constraints:memory": 1.0} if oom else {}
        user_attrs = {**self.trial_attrs, "origin": "imported", **_present(attrs)}
        return self._create(optuna.trial.create_trial(
            state=state, value=value if state == TrialState.COMPLETE else None, params=params_of(config),
            distributions=self.distributions, system_attrs=system_attrs, user_attrs=user_attrs))

    def tell_complete(self, number: int, value: float, attrs: dict[str, Any]) -> None:
        self._end(number, TrialState.COMPLETE, attrs, value=float(value))

    def tell_infeasible(self, number: int, constraint: str, value: float, attrs: dict[str, Any]) -> None:
        """PRUNED with a positive constraint `constraint` (memory, legality, duplicate)."""
        self._end(number, TrialState.PRUNED, attrs, constraint=(constraint, max(float(value), 1e-6)))

    def tell_pruned(self, number: int, step: int, value: float | None, attrs: dict[str, Any]) -> None:
        """PRUNED; `value` (the throughput measured so far) is its report at `step`."""
        self._end(number, TrialState.PRUNED, attrs, report=None if value is None else (step, float(value)))

    def tell_fail(self, number: int, attrs: dict[str, Any]) -> None:
        self._end(number, TrialState.FAIL, attrs)

    def _end(self, number: int, state: TrialState, attrs: dict[str, Any], value: float | None = None,
             constraint: tuple[str, float] | None = None, report: tuple[int, float] | None = None) -> None:
        """End trial `number`. A trial already finished (told by a controller before this one resumed)
        stays as it was."""
        trial_id = self._ids.pop(number, None)
        if trial_id is None:
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        system_attrs = {f"constraints:{constraint[0]}": constraint[1]} if constraint else {}
        if ONE_TRANSACTION:
            _end_in_one_transaction(self.storage, trial_id, state, value, _present(attrs), system_attrs, report)
            return
        if self.storage.get_trial(trial_id).state.is_finished():
            return
        try:
            for key, attr in system_attrs.items():
                self.storage.set_trial_system_attr(trial_id, key, attr)
            for key, attr in _present(attrs).items():
                self.storage.set_trial_user_attr(trial_id, key, attr)
            if report is not None:
                self.storage.set_trial_intermediate_value(trial_id, *report)
            self.storage.set_trial_state_values(trial_id, state, None if value is None else [value])
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another controller ended it meanwhile


def _present(attrs: dict[str, Any]) -> dict[str, Any]:
    """The attributes that have a value (a missing metric is left out, not stored as null)."""
    return {key: value for key, value in attrs.items() if value is not None}


def _end_in_one_transaction(storage: optuna.storages.RDBStorage, trial_id: int, state: TrialState,
                            value: float | None, user_attrs: dict[str, Any], system_attrs: dict[str, Any],
                            report: tuple[int, float] | None) -> None:
    """What RDBStorage's set_trial_user_attr, set_trial_system_attr, set_trial_intermediate_value and
    set_trial_state_values do, in one transaction (the trial row locked), through its internals."""
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    with _create_scoped_session(storage.scoped_session) as session:
        trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
        if trial.state.is_finished():
            return
        for key, attr in system_attrs.items():
            storage._set_trial_attr_without_commit(session, models.TrialSystemAttributeModel, trial_id, key, attr)
        for key, attr in user_attrs.items():
            storage._set_trial_attr_without_commit(session, models.TrialUserAttributeModel, trial_id, key, attr)
        if report is not None:
            storage._set_trial_intermediate_value_without_commit(session, trial_id, *report)
        if value is not None:
            storage._set_trial_value_without_commit(session, trial, 0, value)
        trial.state = state
        trial.datetime_complete = dt.datetime.now()  # local naive time, as Optuna stamps it
