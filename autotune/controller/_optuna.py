"""The one file that speaks Optuna. Optuna's study is the study of record for every run: each trial
dispatched (study and validation runs) or imported, and nothing else.

The Optuna study carries the autotune study's name, its objective is named `tokens_per_s_per_gpu`
(`set_metric_names`, shown by optuna-dashboard) and a study system attribute (OWNER_KEY) marks it as
autotune's. Each knob is a categorical parameter over its domain; recompute is one parameter whose
choices are "none", "selective" and "full/<method>/<layers>"; in the study of record each performance
knob the space tunes is one too (the recipe's value when a run leaves it unset). Strategies choose a layout (TPE and GP
sample in a private study of their own) and the controller asks for it here (`ask(config)`) only once
screening let it through: a layout rejected before dispatch never becomes an Optuna trial. Outcomes
are told by trial number, so a resumed controller can tell trials asked by the one that died:
completed -> COMPLETE(value); OOM -> PRUNED with a positive constraint (never FAIL, which makes
samplers propose the same layout again); slow -> PRUNED with its last value; failed / timeout / lost
twice -> FAIL. When it ends, a trial's user attributes say what autotune recorded of it: backend,
`simulated`, origin, strategy, status, reason, message and the five metrics (outcomes.optuna_attrs).
"""

from __future__ import annotations

import datetime as dt
import time
import warnings
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, distribution_to_json
from optuna.trial import TrialState

from autotune.config import LayoutConfig
from autotune.errors import StorageError, StudyError
from autotune.space import SearchSpace
from autotune.storage import engine_kwargs, use_store_pragmas

PLAIN_KNOBS = ("tp", "pp", "vpp", "cp", "ep", "etp", "sp", "mbs", "dist_opt")
OBJECTIVE = "tokens_per_s_per_gpu"  # the study's one value, maximised
OWNER_KEY = "autotune:study"  # study system attribute: the autotune study that created this Optuna study
CREATED_KEY = "autotune:created_at"  # when (Unix time): a younger one may be another start's, half-way
ORPHAN_AGE_S = 120.0  # an Optuna study without its autotune study for this long is a failed start's leftover



def recompute_label(config: LayoutConfig) -> str:
    if config.recompute == "full":
        return f"full/{config.recompute_method}/{config.recompute_num_layers}"
    return config.recompute


def recompute_choices(space: SearchSpace) -> list[str]:
    from autotune.space._enumerate import _recompute_variants

    return [recompute_label(LayoutConfig(recompute=g, recompute_method=m, recompute_num_layers=n))
            for g, m, n in _recompute_variants(space.domains)]


def distributions(space: SearchSpace, perf: bool = False) -> dict[str, CategoricalDistribution]:
    """The layout knobs' distributions, and with `perf` the tuned performance knobs' (space.perf_domains)."""
    dists = {k: CategoricalDistribution(list(space.domains[k])) for k in PLAIN_KNOBS}
    dists["recompute"] = CategoricalDistribution(recompute_choices(space))
    if perf:
        dists.update({k: CategoricalDistribution(list(values)) for k, values in space.perf_domains.items()})
    return dists


def params_of(config: LayoutConfig, perf_domains: dict[str, tuple] | None = None) -> dict[str, Any]:
    """Optuna parameters of `config`; with `perf_domains`, also those performance knobs the run sets.

    Conditional parameters: a performance knob is a parameter only of the trials that change it, and a
    run can change a child knob only where its parent makes it exist (the legality rules), so e.g.
    `cp_comm_type` appears only on runs with CP > 1 and `dispatcher_sms` only under a flex dispatcher.
    A trial without the parameter ran the recipe's value."""
    values = config.to_dict()
    params = {k: values[k] for k in PLAIN_KNOBS}
    params["recompute"] = recompute_label(config)
    params.update({k: v for k, v in config.perf().items() if k in (perf_domains or {})})
    return params


def config_of(params: dict[str, Any], perf_domains: dict[str, tuple] | None = None) -> LayoutConfig:
    values = {k: params[k] for k in PLAIN_KNOBS}
    label = params["recompute"]
    if label.startswith("full/"):
        _, method, layers = label.split("/")
        values.update(recompute="full", recompute_method=method, recompute_num_layers=int(layers))
    else:
        values["recompute"] = label
    values.update({k: params[k] for k in (perf_domains or {}) if k in params})
    return LayoutConfig.from_mapping(values)


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    # Every strategy (TPE and GP included, which sample in a private study of their own) fixes all
    # parameters of the layouts it proposes; the study of record's sampler then fills nothing.
    return optuna.samplers.RandomSampler(seed=seed)


def _one_transaction_available() -> bool:
    """Whether this Optuna's RDB storage has the internals `_create_running_trial` and
    `_end_in_one_transaction` use (Optuna 5.0 has; tests/controller/test_parts.py says when an upgrade
    takes them away, and that the public API they stand in for writes the same trials)."""
    try:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session  # noqa: F401
    except ImportError:
        return False
    internals = ("_create_new_trial", "_set_trial_attr_without_commit", "_set_trial_value_without_commit",
                 "_set_trial_intermediate_value_without_commit")
    columns = {"trial_id", "param_name", "param_value", "distribution_json"}
    return (all(hasattr(optuna.storages.RDBStorage, n) for n in internals)
            and all(hasattr(models.TrialModel, n) for n in ("find_or_raise_by_id", "count_past_trials"))
            and hasattr(models.StudyModel, "find_or_raise_by_id")
            and columns <= set(models.TrialParamModel.__table__.c.keys()))


# A trial's start and end are one storage transaction each, of a few statements (creating a trial with
# its parameters; ending it with its state, value, attributes and constraint). Through Optuna's public
# storage API the end takes one transaction per attribute, and creating a trial takes three statements
# per parameter (~40 per trial).
ONE_TRANSACTION = _one_transaction_available()


def _make_room(storage: optuna.storages.RDBStorage, name: str) -> None:
    """Before creating the Optuna study `name`: delete one that autotune created for an autotune study
    that does not exist (a start that failed half-way); refuse one that autotune did not create."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return
    attrs = storage.get_study_system_attrs(study_id)
    created = attrs.get(CREATED_KEY)
    if attrs.get(OWNER_KEY) != name or (isinstance(created, (int, float)) and time.time() - created < ORPHAN_AGE_S):
        # a study of another tool, or one another `autotune start` of this name is creating right now
        # (its autotune record follows within a second): never delete it under that start
        raise StudyError(f"the storage holds an Optuna study named {name!r} that is not a leftover of a failed "
                         f"start (another tool's, or another `autotune start` creating it now; a start that failed "
                         f"leaves one that gives way after {ORPHAN_AGE_S / 60:g} minutes): choose another --study")
    storage.delete_study(study_id)


def rdb_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's storage on an autotune store, with the store's connection settings, for autotune's own commands."""
    # Optuna's own log lines would interleave with autotune's output (its "[W] Caught an error from sqlalchemy
    # ... Falling back" came before autotune's one-line error on a broken store). Set here, not when this module
    # is imported: the Python API's AutotuneSampler imports it into a user's program, whose Optuna logging is
    # the user's.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url))
    except RuntimeError as exc:  # review: Optuna's tables at another Optuna's schema were a traceback
        from autotune._paths import one_line
        from autotune.storage._engine import shown_url

        raise StorageError(f"the store {shown_url(url)}: {one_line(str(exc))[:300]}") from None
    use_store_pragmas(storage.engine)  # WAL without an fsync per commit, as our own engine
    return storage


def require_optuna_study(storage: optuna.storages.RDBStorage | str, study_name: str) -> None:
    """A StudyError unless the store holds the Optuna study `study_name` (a storage, or a store URL).

    Found by the storage pass: a deleted Optuna study was made anew, empty, and `resume` then ran its runs into
    numbers its rows held ("could not allocate a trial number after 50 attempts"), the study left `running`.
    """
    if isinstance(storage, str):
        storage = rdb_storage(storage)
    try:
        storage.get_study_id_from_name(study_name)
    except KeyError:
        raise StudyError(f"the Optuna study {study_name!r} of this study is not in the store (deleted with "
                         "`optuna delete-study`?): its trials of record are gone, so it cannot go on; start a new "
                         "study") from None


class OptunaStudy:
    """Optuna's view of an autotune study, in the same database as autotune's tables.

    `create` makes the Optuna study (`_make_room` first); otherwise it is loaded, and a missing one is a
    StudyError: the study's history of record is gone and cannot be resumed or imported into.
    `backend` (the autotune study's) is written on every trial this object ends or imports.
    """

    def __init__(self, url: str, study_name: str, space: SearchSpace, sampler: str, seed: int | None,
                 create: bool, backend: str | None = None) -> None:
        self.storage = rdb_storage(url)
        if create:
            _make_room(self.storage, study_name)
        else:
            require_optuna_study(self.storage, study_name)
        try:
            self.study = optuna.create_study(storage=self.storage, study_name=study_name, direction="maximize",
                                             sampler=make_sampler(sampler, seed), load_if_exists=not create)
        except optuna.exceptions.DuplicatedStudyError:  # another start of the same name won the race
            raise StudyError(f"study {study_name!r} already exists (another `autotune start` created it just "
                             "now): choose another --study") from None
        self.study_id = self.storage.get_study_id_from_name(study_name)
        if create:
            self.storage.set_study_system_attr(self.study_id, CREATED_KEY, time.time())
            self.storage.set_study_system_attr(self.study_id, OWNER_KEY, study_name)
            with warnings.catch_warnings():  # set_metric_names is experimental since Optuna 3.2
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self.study.set_metric_names([OBJECTIVE])
        # the study of record also names the performance knobs a run set (strategies sample layouts only)
        self.perf_domains = dict(space.perf_domains)
        self.distributions = distributions(space, perf=True)
        self.trial_attrs = {"backend": backend, "simulated": backend == "simulate"} if backend else {}
        self._ids: dict[int, int] = {}  # trial number -> storage id, for the trials this process created
        self._checked = False  # whether a trial created here had its distributions checked by Optuna

    def _create(self, template: optuna.trial.FrozenTrial) -> int:
        """Create a trial from `template` in one storage transaction; its number. The first trial this
        process creates goes through Optuna's own path, which checks that each parameter's distribution
        agrees with the study's earlier trials; the others, with the same distributions, skip the check."""
        if ONE_TRANSACTION and self._checked and template.state == TrialState.RUNNING:  # ask's: no attributes
            number, trial_id = _create_running_trial(self.storage, self.study_id, template)
        elif ONE_TRANSACTION:
            created = self.storage._create_new_trial(self.study_id, template_trial=template)
            number, trial_id = created.number, created._trial_id
            self._checked = True
        else:
            trial_id = self.storage.create_new_trial(self.study_id, template_trial=template)
            number = self.storage.get_trial_number_from_id(trial_id)
        self._ids[number] = trial_id
        return number

    def ask(self, config: LayoutConfig) -> int:
        """A RUNNING trial with `config` as its parameters (the effect of enqueue_trial + ask, in one
        storage transaction); its number. Ask only for a layout that is about to be dispatched. Its
        attributes are written when it ends (with the outcome, in the same transaction)."""
        params = params_of(config, self.perf_domains)
        return self._create(optuna.trial.create_trial(state=TrialState.RUNNING, params=params,
                                                      distributions=self._distributions_of(params)))

    def add_measured(self, config: LayoutConfig, value: float | None, oom: bool, attrs: dict[str, Any]) -> int:
        """Record a run made outside the controller (an imported log) as a finished trial; its number."""
        state = TrialState.COMPLETE if value is not None and not oom else TrialState.PRUNED
        system_attrs = {"constraints:memory": 1.0} if oom else {}
        user_attrs = {**self.trial_attrs, **_present(attrs)}
        params = params_of(config, self.perf_domains)
        return self._create(optuna.trial.create_trial(
            state=state, value=value if state == TrialState.COMPLETE else None, params=params,
            distributions=self._distributions_of(params), system_attrs=system_attrs, user_attrs=user_attrs))

    def _distributions_of(self, params: dict[str, Any]) -> dict[str, CategoricalDistribution]:
        """The distributions of the parameters a trial has (performance knobs are conditional)."""
        return {k: self.distributions[k] for k in params}

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
        user_attrs = {**self.trial_attrs, **_present(attrs)}
        if ONE_TRANSACTION:
            _end_in_one_transaction(self.storage, trial_id, state, value, user_attrs, system_attrs, report)
            return
        if self.storage.get_trial(trial_id).state.is_finished():
            return
        try:
            for key, attr in system_attrs.items():
                self.storage.set_trial_system_attr(trial_id, key, attr)
            for key, attr in user_attrs.items():
                self.storage.set_trial_user_attr(trial_id, key, attr)
            if report is not None:
                self.storage.set_trial_intermediate_value(trial_id, *report)
            self.storage.set_trial_state_values(trial_id, state, None if value is None else [value])
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another controller ended it meanwhile


def _present(attrs: dict[str, Any]) -> dict[str, Any]:
    """The attributes that have a value (a missing metric is left out, not stored as null)."""
    return {key: value for key, value in attrs.items() if value is not None}


def _create_running_trial(storage: optuna.storages.RDBStorage, study_id: int,
                          template: optuna.trial.FrozenTrial) -> tuple[int, int]:
    """(number, storage id) of a new RUNNING trial with the template's parameters: what RDBStorage's
    _create_new_trial does (the study row locked while the trial is numbered), with its parameters
    inserted in one statement and their distributions not checked again."""
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session
    from sqlalchemy import insert

    with _create_scoped_session(storage.scoped_session) as session:
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        trial = models.TrialModel(study_id=study_id, number=None, state=TrialState.RUNNING,
                                  datetime_start=dt.datetime.now())
        session.add(trial)
        session.flush()
        session.execute(insert(models.TrialParamModel), [
            {"trial_id": trial.trial_id, "param_name": name, "distribution_json": distribution_to_json(dist),
             "param_value": dist.to_internal_repr(template.params[name])}
            for name, dist in template.distributions.items()])
        trial.number = trial.count_past_trials(session)
        return trial.number, trial.trial_id


def _end_in_one_transaction(storage: optuna.storages.RDBStorage, trial_id: int, state: TrialState,
                            value: float | None, user_attrs: dict[str, Any], system_attrs: dict[str, Any],
                            report: tuple[int, float] | None) -> None:
    """What RDBStorage's set_trial_user_attr, set_trial_system_attr, set_trial_intermediate_value and
    set_trial_state_values do, in one transaction (the trial row locked), through its internals; the
    user attributes in two statements (set_trial_user_attr takes two per attribute)."""
    import json

    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session
    from sqlalchemy import delete, insert

    table = models.TrialUserAttributeModel
    with _create_scoped_session(storage.scoped_session) as session:
        trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
        if trial.state.is_finished():
            return
        for key, attr in system_attrs.items():
            storage._set_trial_attr_without_commit(session, models.TrialSystemAttributeModel, trial_id, key, attr)
        if user_attrs:
            session.execute(delete(table).where(table.trial_id == trial_id, table.key.in_(list(user_attrs))))
            session.execute(insert(table), [{"trial_id": trial_id, "key": key, "value_json": json.dumps(attr)}
                                            for key, attr in user_attrs.items()])
        if report is not None:
            storage._set_trial_intermediate_value_without_commit(session, trial_id, *report)
        if value is not None:
            storage._set_trial_value_without_commit(session, trial, 0, value)
        trial.state = state
        trial.datetime_complete = dt.datetime.now()  # local naive time, as Optuna stamps it
