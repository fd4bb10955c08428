"""The repository and migrations, on a real SQLite file and the real PostgreSQL server."""

from __future__ import annotations

import datetime as dt
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import inspect, text

from autotune.errors import StorageError, StudyError
from autotune.storage import REJECTED_BASE, Repository, current_revision, head_revision, make_engine, upgrade
from autotune.storage.migrations import VERSION_TABLE, downgrade, stamped_revision
from autotune.storage.models import SCHEMA_REVISION, Adoption, ClaimRefused, TrialOrigin, utcnow
from autotune.storage.repository import GpuHourCap


WORKLOAD = {"gpus": 16, "gpus_per_node": 8, "gpu": "h100", "global_batch_size": 1024, "seq_length": 4096,
            "precision": "bf16"}


# a study row as revision 0001 stored it (the workload and space every version wrote)
OLD_STUDY = {"workload": json.dumps(WORKLOAD), "space": json.dumps({"domains": {"tp": [1, 2]}})}


def new_study(repo: Repository, name: str = "s", budget: int = 3, **values):
    return repo.create_study(name=name, model="qwen3_30b", workload=WORKLOAD, space={"domains": {}},
                             budget=budget, sampler="auto", backend="simulate", backend_options={}, options={},
                             optuna_study_name=name, status="created", **values)


def test_schema_is_created_with_our_version_table(storage_url):
    repo = Repository.open(storage_url)
    tables = set(inspect(repo.engine).get_table_names())
    assert {"autotune_studies", "autotune_trials", VERSION_TABLE} <= tables
    assert "alembic_version" not in tables  # that name belongs to Optuna
    assert current_revision(repo.engine) == head_revision(repo.engine)
    # opening a store at this revision skips Alembic on the strength of this constant: it must be the head
    assert SCHEMA_REVISION == head_revision(repo.engine) == stamped_revision(repo.engine)


def test_study_names_are_unique(storage_url):
    repo = Repository.open(storage_url)
    new_study(repo)
    with pytest.raises(StudyError, match="already exists"):
        new_study(repo)
    with pytest.raises(StudyError, match="no study named"):
        repo.get_study("missing")


def test_claim_dispatch_enforces_budget_and_uniqueness(storage_url):
    repo = Repository.open(storage_url)
    study = new_study(repo, budget=2)
    assert study.numbering == "optuna"
    first = repo.claim_dispatch(study.id, {"tp": 1}, "k1", 0, "c1", study.budget, number=0)
    assert first.number == 0 == first.optuna_trial_number and first.status == "dispatched"
    assert first.controller_id == "c1"
    assert repo.claim_dispatch(study.id, {"tp": 1}, "k1", 1, "c1", study.budget, number=1) == "duplicate"
    rejected = repo.add_rejected(study.id, {"tp": 3}, "k3", "heads_divisible_by_tp", "32 heads / TP 3")
    assert rejected.number == REJECTED_BASE and rejected.optuna_trial_number is None  # no run's number
    second = repo.claim_dispatch(study.id, {"tp": 2}, "k2", 1, "c1", study.budget, number=1)
    assert second.number == 1  # a run's number is the one the controller passes: its Optuna trial number
    assert repo.claim_dispatch(study.id, {"tp": 4}, "k4", 2, "c1", study.budget, number=2) == "budget"
    counts = repo.counts(study.id)
    assert counts["dispatched"] == 2 and counts["rejected"] == 1 and counts["running"] == 2


def _cap(hours: float, first_run_s: float) -> GpuHourCap:
    return GpuHourCap(hours, first_run_s, utcnow() - dt.timedelta(minutes=5))


def test_claim_dispatch_refuses_a_run_past_the_gpu_hour_cap(storage_url):
    """Runs in flight count as a whole run each (before any ended: the forecast's run), so with 2,000 GPU-s a run
    and a 1 GPU-hour cap the third start is refused; a stopped run (no heartbeat) holds nothing; once runs have
    ended, one in flight counts at their mean."""
    repo = Repository.open(storage_url)
    study = new_study(repo, budget=10)
    cap = _cap(1.0, 2000.0)
    assert repo.cap_reached(study.id, cap) == (False, 0)
    first = repo.claim_dispatch(study.id, {"tp": 1}, "k1", 0, "c1", study.budget, number=0, cap=cap)
    second = repo.claim_dispatch(study.id, {"tp": 2}, "k2", 1, "c1", study.budget, number=1, cap=cap)
    assert not isinstance(first, ClaimRefused) and not isinstance(second, ClaimRefused)
    assert repo.cap_reached(study.id, cap) == (True, 2)
    assert repo.claim_dispatch(study.id, {"tp": 4}, "k4", 2, "c1", study.budget, number=2, cap=cap) is ClaimRefused.CAP
    assert repo.counts(study.id)["dispatched"] == 2  # the refused claim stored nothing
    repo.release_trials(study.id, [second.number], {second.number: 100.0})  # stopped: it holds its GPUs no more
    assert repo.cap_reached(study.id, cap) == (False, 1)
    repo.finish_trial(study.id, first.number, "completed", metrics={"step_time_s": 2.0, "tokens_per_s_per_gpu": 5.0},
                      step_times_s=[2.0], gpu_seconds=1700.0)
    # 1,800 spent, nothing live: room; one run in flight then counts at the ended runs' mean (1,700), not 2,000
    assert repo.cap_reached(study.id, cap) == (False, 0)
    third = repo.claim_dispatch(study.id, {"tp": 4}, "k4", 2, "c1", study.budget, number=2, cap=cap)
    assert not isinstance(third, ClaimRefused)
    assert repo.cap_reached(study.id, cap) == (False, 1)  # 1,800 + 1,700 < 3,600
    assert repo.cap_reached(study.id, _cap(3500 / 3600, 2000.0)) == (True, 1)
    # a validation run is GPU time too
    assert repo.claim_dispatch(study.id, {"tp": 4}, "k4", 3, "c1", study.budget, number=3, dispatch_key="k4#validate",
                               origin=TrialOrigin.VALIDATION, cap=_cap(3500 / 3600, 2000.0)) is ClaimRefused.CAP


def _room_for_one() -> GpuHourCap:
    """With one run of 2,000 GPU-s in flight: room for exactly one more (taken when used: its live-after moment is
    five minutes before now)."""
    return _cap(1.0, 2000.0)


def _races(postgres_url: str, name: str, prepare, act):
    """Twelve rounds of a study with one run in flight under _room_for_one(), `prepare(repo, study)` done, and two
    connections calling `act(repo, study, index, prepared)` at the same moment; yields each round's study and
    its two results."""
    setup = Repository.open(postgres_url)
    repos = [Repository.open(postgres_url) for _ in range(2)]
    for round_number in range(12):
        study = new_study(setup, name=f"{name}{round_number}", budget=10)
        setup.claim_dispatch(study.id, {"tp": 1}, "k0", 0, "c0", study.budget, number=0, cap=_room_for_one())
        prepared = prepare(setup, study)
        barrier = threading.Barrier(2)

        def at_once(index: int):
            barrier.wait()
            return act(repos[index], study, index, prepared)

        with ThreadPoolExecutor(2) as pool:
            yield setup, study, list(pool.map(at_once, range(2)))


def test_two_controllers_cannot_both_start_a_run_into_the_last_room_under_the_cap(postgres_url):
    """Review: each controller checked the cap alone before claiming, so two controllers of one study could each
    start a run into room for one. claim_dispatch counts the runs in flight under the study row's lock: of two
    claims made at the same moment by two connections, one is refused, round after round."""
    def claim(repo, study, index, _):
        return repo.claim_dispatch(study.id, {"tp": 2 + index}, f"k{index + 1}", index + 1, f"c{index + 1}",
                                   study.budget, number=index + 1, cap=_room_for_one())

    for setup, study, results in _races(postgres_url, "race", lambda repo, study: None, claim):
        assert sum(r is ClaimRefused.CAP for r in results) == 1, results
        assert setup.counts(study.id)["dispatched"] == 2


def _stale(repo: Repository, study, key: str, number: int):
    """A run claimed by a controller that died an hour ago (its heartbeat stopped then)."""
    from autotune.storage.models import TrialRow

    trial = repo.claim_dispatch(study.id, {"tp": number}, key, number, "dead", study.budget, number=number)
    with repo.session() as s:
        row = s.query(TrialRow).filter(TrialRow.study_id == study.id, TrialRow.number == trial.number).one()
        row.heartbeat_at = utcnow() - dt.timedelta(hours=1)
    return trial


def test_a_dead_controllers_run_is_adopted_to_run_again_only_into_room_under_the_cap(storage_url):
    """adopt_trial with a cap counts what claim_dispatch counts (runs in flight at a whole run each) plus the time
    the dead attempt held: while runs in flight fill the room it writes nothing (WAIT: the trial stays stale, so
    nobody counts it in flight); with none in flight and the cap reached it adopts the trial to end it (CAP)."""
    repo = Repository.open(storage_url)
    study = new_study(repo, budget=10)
    cap = _cap(1.0, 2000.0)
    cutoff = utcnow() - dt.timedelta(minutes=5)
    live = repo.claim_dispatch(study.id, {"tp": 1}, "k1", 1, "c1", study.budget, number=1, cap=cap)
    stale = _stale(repo, study, "k2", 2)
    before = repo.trial(study.id, stale.number)
    # 0 spent + 1,700 held + 2,000 in flight >= 3,600
    assert repo.adopt_trial(study.id, stale.number, "c2", cutoff, cap=cap, held_gpu_seconds=1700.0) is Adoption.WAIT
    assert repo.trial(study.id, stale.number) == before  # nothing written: still stale, still the dead one's
    assert [t.number for t in repo.stale_trials(study.id, 60, "c2")] == [stale.number]
    repo.finish_trial(study.id, live.number, "completed", metrics={"step_time_s": 2.0, "tokens_per_s_per_gpu": 5.0},
                      step_times_s=[2.0], gpu_seconds=1000.0)
    # nothing else in flight: 1,000 spent + 1,700 held < 3,600
    assert repo.adopt_trial(study.id, stale.number, "c2", cutoff, cap=cap, held_gpu_seconds=1700.0) is Adoption.ADOPTED
    assert repo.trial(study.id, stale.number).controller_id == "c2"
    # the adopted run now counts in flight, at the ended runs' mean: 1,000 spent + 1,000 reach a 2,000 cap
    third = _stale(repo, study, "k3", 3)
    assert repo.adopt_trial(study.id, third.number, "c3", cutoff, cap=_cap(2000 / 3600, 2000.0)) is Adoption.WAIT
    # the cap spent with nothing in flight (2,000 >= 1,900): adopted, to be ended
    repo.finish_trial(study.id, stale.number, "completed", metrics={"step_time_s": 2.0, "tokens_per_s_per_gpu": 5.0},
                      step_times_s=[2.0], gpu_seconds=1000.0)
    assert repo.adopt_trial(study.id, third.number, "c3", cutoff, cap=_cap(1900 / 3600, 2000.0)) is Adoption.CAP
    assert repo.trial(study.id, third.number).controller_id == "c3"
    assert repo.adopt_trial(study.id, third.number, "c4", cutoff, cap=cap) is Adoption.TAKEN


def test_two_controllers_cannot_both_rerun_a_dead_controllers_run_into_the_last_room(postgres_url):
    """The last note: the adopter checked the time spent alone (no run in flight counted) outside the study row's
    lock, so two controllers adopting two dead runs at the same moment both started one into room for one. Round
    after round, of two adopters each adopting its own dead run at once, exactly one gets it and the other waits
    (a review of a first fix, which checked at the re-run after adopting: each counted the other's freshly adopted
    run in flight, and both waited)."""
    def dead_runs(repo, study):
        return [_stale(repo, study, f"k{n}", n) for n in (1, 2)]

    def adopt(repo, study, index, dead):
        return repo.adopt_trial(study.id, dead[index].number, f"c{index + 1}", utcnow() - dt.timedelta(minutes=5),
                                cap=_room_for_one())

    for _, _, results in _races(postgres_url, "adopt", dead_runs, adopt):
        assert sorted(results) == [Adoption.ADOPTED, Adoption.WAIT], results


def test_rejected_layouts_of_an_optuna_numbered_study_are_numbered_apart(storage_url):
    """Runs take the numbers Optuna gives them (0, 1, 2, ...); rejected layouts are no Optuna trials and
    are numbered from REJECTED_BASE, so neither ever takes the other's number."""
    repo = Repository.open(storage_url)
    study = new_study(repo, budget=5)
    frontier = [{"config": {"tp": t}, "config_key": f"f{t}", "reason": "oom_frontier", "message": "m",
                 "implied_by_trial": 0} for t in (2, 4)]
    repo.add_rejected_many(study.id, frontier)
    repo.add_rejected(study.id, {"tp": 3}, "k3", "heads_divisible_by_tp", "32 heads / TP 3")
    for number in (0, 1):
        repo.claim_dispatch(study.id, {"tp": 1, "pp": number + 1}, f"k{number}", number, "c1", study.budget, number=number)
    unnumbered = repo.claim_dispatch(study.id, {"tp": 8}, "k8", None, "c1", study.budget)  # next free run number
    assert [(t.number, t.status) for t in repo.trials(study.id)] == [
        (0, "dispatched"), (1, "dispatched"), (2, "dispatched"), (REJECTED_BASE, "rejected"),
        (REJECTED_BASE + 1, "rejected"), (REJECTED_BASE + 2, "rejected")]
    assert unnumbered.number == 2
    assert repo.counts(study.id)["rejected"] == 3


def test_a_sequence_numbered_study_keeps_one_sequence(storage_url):
    """A study from before revision 0004 goes on numbering every row, rejected ones included, from its highest."""
    repo = Repository.open(storage_url)
    study = new_study(repo, numbering="sequence")
    first = repo.claim_dispatch(study.id, {"tp": 1}, "k1", 0, "c1", study.budget)
    rejected = repo.add_rejected(study.id, {"tp": 3}, "k3", "heads_divisible_by_tp", "32 heads / TP 3")
    repo.add_rejected_many(study.id, [{"config": {"tp": 5}, "config_key": "k5", "reason": "oom_frontier",
                                       "message": "m", "implied_by_trial": 1}])
    second = repo.claim_dispatch(study.id, {"tp": 2}, "k2", 1, "c1", study.budget)
    assert (first.number, rejected.number, second.number) == (1, 2, 4)
    assert [t.number for t in repo.trials(study.id)] == [1, 2, 3, 4]


def test_finish_and_retry_keep_gpu_seconds(storage_url):
    repo = Repository.open(storage_url)
    study = new_study(repo)
    trial = repo.claim_dispatch(study.id, {"tp": 1}, "k1", 0, "c1", study.budget)
    repo.retry_trial(study.id, trial.number, "lost", "c2", gpu_seconds=100.0)
    again = repo.trial(study.id, trial.number)
    assert again.attempt == 2 and again.status == "dispatched" and again.controller_id == "c2"
    repo.finish_trial(study.id, trial.number, "completed", metrics={"step_time_s": 2.0, "tokens_per_s_per_gpu": 5.0},
                      step_times_s=[2.1, 2.0], gpu_seconds=50.0)
    done = repo.trial(study.id, trial.number)
    assert done.status == "completed" and done.gpu_seconds == 150.0 and done.step_times_s == [2.1, 2.0]
    assert repo.counts(study.id)["completed"] == 1


def test_a_launchers_nul_and_lone_surrogates_are_stored_as_replacement_characters(storage_url):
    """Found by an adversarial pass: a launcher's message with a NUL (PostgreSQL refuses it in text) or an
    escaped lone surrogate (not UTF-8: SQLite's driver refuses to encode it) stopped the controller with the
    trial dispatched, and every resume died the same way. Every store keeps them as U+FFFD in its text columns;
    its JSON columns escape them and read them back as written (review: a non-UTF-8 path must stay the path)."""
    repo = Repository.open(storage_url)
    study = new_study(repo)
    trial = repo.claim_dispatch(study.id, {"tp": 1}, "k1", 0, "c1", study.budget)
    repo.retry_trial(study.id, trial.number, "lost\x00 \ud800", "c2", worker_lost=True)
    repo.finish_trial(study.id, trial.number, "failed", reason="launcher\x00", message="bad\x00nul \ud800 surrogate",
                      artifacts={"log\ud800": "a\x00b", "list": ["\udfff", 1]})
    done = repo.trial(study.id, trial.number)
    assert done.message == "bad\ufffdnul \ufffd surrogate" and done.reason == "launcher\ufffd"
    assert done.artifacts["log\ud800"] == "a\x00b" and done.artifacts["list"] == ["\udfff", 1]
    assert done.artifacts["losses"] == ["lost\x00 \ud800"]
    rejected = repo.add_rejected(study.id, {"tp": 2}, "k2", "rule", "why\x00")
    assert repo.trial(study.id, rejected.number).message == "why\ufffd"
    repo.close()


def test_stale_trials_are_adopted_once(storage_url):
    import datetime as dt

    from autotune.storage.models import utcnow

    repo = Repository.open(storage_url)
    study = new_study(repo)
    trial = repo.claim_dispatch(study.id, {"tp": 1}, "k1", 0, "dead", study.budget)
    assert repo.stale_trials(study.id, 60, "me") == []  # its heartbeat is fresh
    stale = repo.stale_trials(study.id, -1, "me")
    assert [t.number for t in stale] == [trial.number]
    cutoff = utcnow() + dt.timedelta(seconds=1)
    assert repo.adopt_trial(study.id, trial.number, "me", cutoff) is Adoption.ADOPTED
    assert repo.adopt_trial(study.id, trial.number, "other", utcnow() - dt.timedelta(seconds=60)) is Adoption.TAKEN


def test_upgrade_from_the_first_released_schema(storage_url):
    """A database created by revision 0001 (the first released schema) upgrades with its data."""
    engine = make_engine(storage_url)
    upgrade(engine, "0001_initial")
    with engine.begin() as c:
        c.execute(text("INSERT INTO autotune_studies (name, model, workload, space, budget, sampler, backend, "
                       "backend_options, options, optuna_study_name, status, created_at, updated_at) VALUES "
                       "('old', 'qwen3_30b', :workload, :space, 5, 'auto', 'simulate', '{}', '{}', 'autotune:old', "
                       "'finished', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"), OLD_STUDY)
    with pytest.raises(StorageError, match="autotune db upgrade"):
        Repository.open(storage_url)
    upgrade(engine)
    repo = Repository.open(storage_url)
    assert repo.get_study("old").budget == 5
    # no Optuna tables yet: the name is simply the study's, the numbering the one the study began with
    assert (repo.get_study("old").optuna_study_name, repo.get_study("old").numbering) == ("old", "sequence")
    columns = {c["name"] for c in inspect(repo.engine).get_columns("autotune_trials")}
    assert {"predicted", "controller_id"} <= columns


def test_upgrade_to_0003_moves_origin_and_worker_losses_out_of_other_fields(storage_url):
    """0003 turns the strategy notes that were types into origins and the artifacts' loss count into a column."""
    engine = make_engine(storage_url)
    upgrade(engine, "0002_trial_prediction_owner")
    with engine.begin() as c:
        c.execute(text("INSERT INTO autotune_studies (id, name, model, workload, space, budget, sampler, backend, "
                       "backend_options, options, optuna_study_name, status, created_at, updated_at) VALUES "
                       "(1, 'old', 'qwen3_30b', :workload, :space, 5, 'auto', 'simulate', '{}', '{}', 'autotune:old', "
                       "'finished', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"), OLD_STUDY)
        for number, note, artifacts in ((1, "baseline", '{"worker_losses": 1, "losses": ["node died"]}'),
                                        (2, "imported", '{"log": "run.log"}'), (3, "validation", '{}')):
            c.execute(text("INSERT INTO autotune_trials (study_id, number, config, config_key, dispatched, status, "
                           "strategy_note, attempt, step_times_s, gpu_seconds, artifacts, created_at) VALUES "
                           f"(1, {number}, '{{}}', 'k{number}', TRUE, 'completed', '{note}', 1, '[]', 0, "
                           f"'{artifacts}', CURRENT_TIMESTAMP)"))
    upgrade(engine)
    repo = Repository.open(storage_url)
    study = repo.get_study("old")
    trials = {t.number: t for t in repo.trials(study.id)}
    assert [(t.origin, t.worker_losses) for t in trials.values()] == [("study", 1), ("imported", 0), ("validation", 0)]
    assert trials[1].artifacts == {"losses": ["node died"]}  # the count lives in its column only
    counts = repo.counts(study.id)
    assert (counts["dispatched"], counts["imported"], counts["validation"]) == (1, 1, 1)
    repo.close()
    downgrade(engine, "0002_trial_prediction_owner")  # a downgrade puts both back where 0002's code reads them
    with engine.connect() as c:
        rows = c.execute(text("SELECT number, strategy_note, artifacts FROM autotune_trials ORDER BY number")).all()
    assert [r.strategy_note for r in rows] == ["baseline", "imported", "validation"]
    artifacts = rows[0].artifacts if isinstance(rows[0].artifacts, dict) else json.loads(rows[0].artifacts)
    assert artifacts["worker_losses"] == 1


def test_upgrade_to_0004_names_each_optuna_study_like_its_study(storage_url):
    """0004 renames the Optuna study `autotune:NAME` of study NAME to NAME, names its objective, and writes
    the recorded metrics, status and reason of each trial as user attributes; a study whose plain name
    another Optuna study holds keeps its old one. The studies keep their numbering; downgrade renames back."""
    import optuna
    from optuna.trial import TrialState

    engine = make_engine(storage_url)
    upgrade(engine, "0003_trial_origin_worker_losses")
    old = optuna.create_study(study_name="autotune:old", storage=storage_url, direction="maximize")
    for state, value in ((TrialState.PRUNED, None), (TrialState.COMPLETE, 7400.0)):  # what 0003's controller wrote
        old.add_trial(optuna.trial.create_trial(state=state, value=value, user_attrs={"autotune_reason": "x"}))
    optuna.create_study(study_name="autotune:clash", storage=storage_url)
    optuna.create_study(study_name="clash", storage=storage_url)  # another tool's study holds the plain name
    with engine.begin() as c:
        for study_id, name in ((1, "old"), (2, "clash")):
            c.execute(text("INSERT INTO autotune_studies (id, name, model, workload, space, budget, sampler, backend, "
                           "backend_options, options, optuna_study_name, status, created_at, updated_at) VALUES "
                           f"({study_id}, '{name}', 'qwen3_30b', :workload, :space, 5, 'auto', 'simulate', '{{}}', "
                           f"'{{}}', 'autotune:{name}', 'interrupted', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"), OLD_STUDY)
        for number, optuna_number, status, reason, speed in ((1, 0, "rejected", "predicted_oom", "NULL"),
                                                             (2, 1, "completed", "NULL", "7400.0")):
            c.execute(text("INSERT INTO autotune_trials (study_id, number, optuna_trial_number, config, config_key, "
                           "dispatched, status, reason, tokens_per_s_per_gpu, peak_mem_gib, attempt, step_times_s, "
                           "gpu_seconds, artifacts, strategy_note, created_at) VALUES "
                           f"(1, {number}, {optuna_number}, '{{}}', "
                           f"'k{number}', {'TRUE' if speed != 'NULL' else 'FALSE'}, '{status}', "
                           f"{reason if reason == 'NULL' else repr(reason)}, {speed}, 61.5, 1, '[]', 0, '{{}}', "
                           "'refine', CURRENT_TIMESTAMP)"))
    upgrade(engine)
    repo = Repository.open(storage_url)
    studies = {s.name: s for s in repo.list_studies()}
    assert (studies["old"].optuna_study_name, studies["clash"].optuna_study_name) == ("old", "autotune:clash")
    assert {s.numbering for s in studies.values()} == {"sequence"}  # the numbers users saw stay
    renamed = optuna.load_study(study_name="old", storage=storage_url)
    assert renamed.metric_names == ["tokens_per_s_per_gpu"]
    rejected, completed = renamed.trials
    assert completed.user_attrs == {"autotune_reason": "x", "backend": "simulate", "simulated": True,
                                    "origin": "study", "strategy": "refine", "status": "completed",
                                    "tokens_per_s_per_gpu": 7400.0, "peak_mem_gib": 61.5}
    assert (rejected.user_attrs["status"], rejected.user_attrs["reason"]) == ("rejected", "predicted_oom")
    assert optuna.load_study(study_name="clash", storage=storage_url).metric_names is None  # not ours: untouched
    with pytest.raises(KeyError):
        optuna.load_study(study_name="autotune:old", storage=storage_url)
    # the study goes on in its own numbering: one sequence over every row
    assert repo.claim_dispatch(1, {"tp": 2}, "k3", 2, "c", 5).number == 3
    repo.close()
    downgrade(engine, "0003_trial_origin_worker_losses")
    assert len(optuna.load_study(study_name="autotune:old", storage=storage_url).trials) == 2
    with engine.connect() as c:
        names = dict(c.execute(text("SELECT name, optuna_study_name FROM autotune_studies")).all())
        assert names == {"old": "autotune:old", "clash": "autotune:clash"}
        assert c.execute(text("SELECT COUNT(*) FROM autotune_trials")).scalar() == 3  # nothing lost on the way down
    assert "numbering" not in {c["name"] for c in inspect(engine).get_columns("autotune_studies")}


def test_newer_schema_is_refused(storage_url):
    repo = Repository.open(storage_url)
    with repo.engine.begin() as c:
        c.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999_future'"))
    with pytest.raises(StorageError, match="newer than this autotune"):
        Repository.open(storage_url)


@pytest.mark.parametrize("url,needle", [
    ("mysql://x@localhost/db", "unsupported database"),
    ("not a url", "not a database URL"),
    ("postgresql+psycopg://nobody@127.0.0.1:1/none", "cannot reach storage"),
])
def test_bad_storage_urls(url, needle):
    with pytest.raises(StorageError, match=needle):
        Repository.open(url)


def test_sqlite_runs_in_wal_mode(tmp_path):
    repo = Repository.open(f"sqlite:///{tmp_path / 'x.db'}")
    with repo.engine.connect() as c:
        assert c.execute(text("PRAGMA journal_mode")).scalar() == "wal"


def test_optunas_connections_to_a_sqlite_store_use_the_stores_settings(tmp_path):
    """Optuna's RDBStorage opened its own connections with SQLite's default synchronous=FULL: an fsync of the
    log at each of its commits (two a trial) where the store's own need none. Both engines write one log,
    so one setting keeps what a power loss leaves a consistent earlier state."""
    from autotune.controller._optuna import OptunaStudy
    from autotune.space import load_space

    url = f"sqlite:///{tmp_path / 'x.db'}"
    repo = Repository.open(url)
    optuna_side = OptunaStudy(url, "t", load_space("qwen3_30b"), "auto", 0, create=True)
    for engine in (repo.engine, optuna_side.storage.engine):
        with engine.connect() as c:
            assert c.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert c.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
            assert c.execute(text("PRAGMA busy_timeout")).scalar() > 0


def test_database_errors_become_one_line_storage_errors(tmp_path):
    """A broken store (here: a table dropped under the repository) is a StorageError naming the store."""
    from sqlalchemy import text

    from autotune.errors import StorageError

    repo = Repository.open(f"sqlite:///{tmp_path / 'broken.db'}")
    with repo.engine.begin() as connection:
        connection.execute(text("DROP TABLE autotune_trials"))
    with pytest.raises(StorageError) as raised:
        repo.trials(1)
    assert "broken.db" in str(raised.value) and "\n" not in str(raised.value)
    repo.close()


def test_states_are_enums_and_a_misspelt_study_status_is_refused(storage_url):
    from autotune.storage import ClaimRefused, StudyStatus

    repo = Repository.open(storage_url)
    study = new_study(repo, name="enum", budget=1)
    assert study.status == StudyStatus.CREATED
    repo.set_study_status(study.id, StudyStatus.RUNNING)
    assert repo.get_study(study.name).status == "running"
    with pytest.raises(ValueError):
        repo.set_study_status(study.id, "runing")
    assert repo.get_study(study.name).status == StudyStatus.RUNNING
    assert not isinstance(repo.claim_dispatch(study.id, {"tp": 1}, "k1", 0, "c1", study.budget), ClaimRefused)
    assert repo.claim_dispatch(study.id, {"tp": 2}, "k2", 1, "c1", study.budget) is ClaimRefused.BUDGET
    repo.close()


def _finished_trial(repo: Repository, name: str):
    study = new_study(repo, name=name, budget=2)
    repo.claim_dispatch(study.id, {"tp": 1}, "k1", 0, "c1", study.budget, number=0)
    repo.finish_trial(study.id, 0, "completed", metrics={"step_time_s": 2.0, "tokens_per_s_per_gpu": 9000.0,
                                                          "tflops_per_gpu": 400.0, "mfu": 0.4, "peak_mem_gib": 61.5},
                      step_times_s=[2.1, 2.0], gpu_seconds=32.0)
    return study


def _raw_rows(repo: Repository) -> list:
    """Every stored row as text (a NaN is not equal to itself)."""
    with repo.engine.connect() as c:
        return [repr(tuple(r)) for table in ("autotune_trials", "autotune_studies")
                for r in c.execute(text(f"SELECT * FROM {table} ORDER BY id"))]


# Values a person (or a broken tool) can put into columns that autotune only ever writes checked values
# into. PostgreSQL's types refuse text in a number column, so those cases are SQLite's only.
TAMPERED_ON_BOTH = [
    ("autotune_trials", "tokens_per_s_per_gpu = -5", "tokens_per_s_per_gpu = -5"),
    ("autotune_trials", "step_time_s = 'NaN'", "step_time_s = "),
    ("autotune_trials", "peak_mem_gib = 'Infinity'", "peak_mem_gib = "),
    ("autotune_trials", "mfu = 0", "mfu = 0"),
    ("autotune_trials", "status = 'weird'", "status = 'weird'"),
    ("autotune_trials", "origin = 'elsewhere'", "origin = 'elsewhere'"),
    ("autotune_trials", "config = '[1]'", "config = [1]"),
    ("autotune_trials", "artifacts = '\"text\"'", "artifacts = 'text'"),
    ("autotune_trials", "step_times_s = '[\"a\", 1]'", "step_times_s = ['a', 1]"),
    # JSON reads a 400-digit number as a Python int beyond float range: math.isfinite() raises on it
    ("autotune_trials", "step_times_s = '[1" + "0" * 400 + "]'", "step_times_s = [1000"),
    ("autotune_trials", "config = '{\"tp\": 1" + "0" * 400 + "}'", "config = {'tp': 1000"),
    ("autotune_trials", "config = '{\"tp\": \"abc\"}'", "config = {'tp': 'abc'}"),  # no configuration
    ("autotune_trials", "config = '{\"bogus_knob\": 2}'", "config = {'bogus_knob': 2}"),
    ("autotune_studies", "space = '{\"domains\": {}, \"document\": 5}'", "not a space"),
    ("autotune_studies", "workload = '{\"gpus\": 1" + "0" * 400 + ", \"gpus_per_node\": 8, \"gpu\": \"h100\", "
     "\"global_batch_size\": 512, \"seq_length\": 4096, \"precision\": \"bf16\"}'", "workload = {'gpus': 1000"),
    ("autotune_trials", "worker_losses = -1", "worker_losses = -1"),
    ("autotune_trials", "gpu_seconds = -3", "gpu_seconds = -3"),
    ("autotune_trials", "gpu_seconds = 1e308", "gpu_seconds = 1e+308"),  # two summed to inf (review)
    # no GPU runs these (review: 1e12 tokens/s/GPU was shown, exported and recommended)
    ("autotune_trials", "tokens_per_s_per_gpu = 1e13", "tokens_per_s_per_gpu = 10000000000000.0"),
    ("autotune_trials", "mfu = 30", "mfu = 30"),
    ("autotune_trials", "tflops_per_gpu = 1e6", "tflops_per_gpu = 1000000.0"),
    ("autotune_trials", "peak_mem_gib = 1e6", "peak_mem_gib = 1000000.0"),
    ("autotune_studies", "workload = '{\"gpus\": 16, \"gpus_per_node\": 8, \"gpu\": \"h100\", \"global_batch_size\": 512, "
     "\"seq_length\": 4096, \"precision\": \"bf16\", \"network_gbps\": 1e9}'", "workload = {'gpus': 16"),
    ("autotune_studies", "workload = '[]'", "workload = []"),
    ("autotune_studies", "workload = '{}'", "workload = {}"),
    ("autotune_studies", "space = '{\"domains\": {\"tp\": 5}}'", "not a space"),
    ("autotune_studies", "budget = -1", "budget = -1"),
    ("autotune_studies", "budget = 0", "budget = 0"),  # read `10/0 finished` (review)
    ("autotune_studies", "status = 'zz'", "status = 'zz'"),
    # printed by status and compare: a terminal escape edited in would reach the terminal
    ("autotune_studies", "model = 'llama\x1b[31m'", "model = 'llama\\x1b[31m'"),
    ("autotune_studies", "sampler = 'auto\nx'", "sampler = 'auto\\nx'"),
    ("autotune_studies", "backend = ''", "backend = ''"),
]
TAMPERED_ON_SQLITE = [
    ("autotune_trials", "peak_mem_gib = 'abc'", "peak_mem_gib = 'abc'"),
    ("autotune_trials", "mfu = X'00'", "mfu = b'\\x00'"),
    ("autotune_trials", "optuna_trial_number = 'x'", "optuna_trial_number = 'x'"),
    ("autotune_trials", "attempt = 1e30", "attempt = 1e+30"),
    ("autotune_trials", "artifacts = 'not json'", "cannot be read"),
    ("autotune_trials", "created_at = 'garbage'", "cannot be read"),
    ("autotune_studies", "budget = 'x'", "budget = 'x'"),
]


@pytest.mark.parametrize("table,assignment,needle", TAMPERED_ON_BOTH, ids=[a[:48] for _, a, _ in TAMPERED_ON_BOTH])
def test_a_hand_edited_row_is_one_line_storage_error_and_nothing_changes(storage_url, table, assignment, needle):
    """The storage boundary refuses a row autotune would never have written (issue 15's review: a text in
    a Float column ended in a TypeError deep in the ranking), naming the column and its value."""
    _hand_edited_row_is_refused(storage_url, table, assignment, needle)


@pytest.mark.parametrize("table,assignment,needle", TAMPERED_ON_SQLITE, ids=[a[:48] for _, a, _ in TAMPERED_ON_SQLITE])
def test_a_hand_edited_sqlite_row_of_the_wrong_type_is_refused(tmp_path, table, assignment, needle):
    _hand_edited_row_is_refused(f"sqlite:///{tmp_path / 'edited.db'}", table, assignment, needle)


def _hand_edited_row_is_refused(url: str, table: str, assignment: str, needle: str) -> None:
    repo = Repository.open(url)
    study = _finished_trial(repo, "edited")
    assert repo.trials(study.id)[0].tokens_per_s_per_gpu == 9000.0  # readable before the edit
    with repo.engine.begin() as c:
        c.execute(text(f"UPDATE {table} SET {assignment}"))
    before = _raw_rows(repo)
    if table == "autotune_trials":
        reads = [lambda: repo.trials(study.id), lambda: repo.trial(study.id, 0)]
    else:
        reads = [lambda: repo.get_study("edited"), repo.list_studies]
    for read in reads:
        with pytest.raises(StorageError) as raised:
            read()
        message = str(raised.value)
        assert "\n" not in message and needle in message, message
        assert repo.engine.url.database in message  # which store
    assert _raw_rows(repo) == before  # reading refused; nothing rewritten
    repo.close()


@pytest.mark.parametrize("name", ["evil\x1b[31mRED", "two\nlines", "sep\u2028x", "", "n" * 201])
def test_a_study_name_edited_into_the_store_is_refused_where_it_is_read(storage_url, name):
    """`start` takes printable names only; one edited into the store would send a terminal escape or a
    line break through `status`, the leaderboard and the final summary: refused where the row is read."""
    if len(name) > 200 and storage_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's VARCHAR(200) refuses the edit itself")
    repo = Repository.open(storage_url)
    _finished_trial(repo, "edited")
    with repo.engine.begin() as c:
        c.execute(text("UPDATE autotune_studies SET name = :name"), {"name": name})
    before = _raw_rows(repo)
    for read in (repo.list_studies, lambda: repo.get_study(name)):
        with pytest.raises(StorageError) as raised:
            read()
        message = str(raised.value)
        assert "\n" not in message and "\x1b" not in message and "printable" in message, message
    assert _raw_rows(repo) == before
    repo.close()


def test_a_failed_runs_implausible_step_times_are_not_stored(storage_url):
    """Only completed and OOM results are validated whole; a failed run's step times arrive as the launcher
    sent them. Stored as sent, a 0 made the study unreadable (the read side refuses it): keep the plausible."""
    repo = Repository.open(storage_url)
    study = new_study(repo, name="failed", budget=2)
    repo.claim_dispatch(study.id, {"tp": 1}, "k1", 0, "c1", study.budget, number=0)
    repo.finish_trial(study.id, 0, "failed", reason="invalid_result", step_times_s=[0, float("nan"), -1.0, "abc", True,
                                                                                    2.5, 1e400])
    assert repo.trial(study.id, 0).step_times_s == [2.5]
    # nor its figures beyond what any GPU runs (the read side refuses those too since the review)
    repo.claim_dispatch(study.id, {"tp": 2}, "k2", 1, "c1", study.budget, number=1)
    repo.finish_trial(study.id, 1, "failed", reason="invalid_result",
                      metrics={"mfu": 50.0, "tokens_per_s_per_gpu": 1e13, "peak_mem_gib": 70.0, "tflops_per_gpu": "x"})
    kept = repo.trial(study.id, 1)
    assert (kept.mfu, kept.tokens_per_s_per_gpu, kept.peak_mem_gib, kept.tflops_per_gpu) == (None, None, 70.0, None)
    repo.close()


@pytest.mark.parametrize("gpu_seconds", [float("inf"), float("nan"), -1.0, 1e308])
def test_an_attempts_gpu_time_that_would_make_the_study_unreadable_is_never_written(storage_url, gpu_seconds):
    """Found by review: one harvested outcome file with wall_time_s 1e308 stored an infinite GPU time, and
    the read side (rightly) refused every study of the store from then on. The controller bounds the time
    (the watchdog); the repository refuses what would still slip through, on both write paths."""
    repo = Repository.open(storage_url)
    study = new_study(repo)
    trial = repo.claim_dispatch(study.id, {"tp": 1}, "k1", 0, "c1", study.budget, number=0)
    with pytest.raises(ValueError, match="gpu_seconds"):
        repo.finish_trial(study.id, trial.number, "completed", gpu_seconds=gpu_seconds)
    with pytest.raises(ValueError, match="gpu_seconds"):
        repo.retry_trial(study.id, trial.number, "again", "c1", gpu_seconds=gpu_seconds)
    repo.finish_trial(study.id, trial.number, "failed", gpu_seconds=3600.0)
    assert repo.trial(study.id, trial.number).gpu_seconds == 3600.0 and repo.list_studies()


def test_0005_adds_the_pooling_cache_and_its_downgrade_drops_only_that(storage_url):
    """A cache column: a 0004 store upgrades with its studies readable and no cache; a downgrade keeps
    every study and trial and drops the column."""
    engine = make_engine(storage_url)
    upgrade(engine, "0004_optuna_names_numbering")
    upgrade(engine)
    repo = Repository.open(storage_url)
    study = new_study(repo, name="kept")
    repo.claim_dispatch(study.id, {"tp": 2}, "k1", 1, "c", 3)
    assert study.pooled_cache is None
    repo.set_pooled_cache(study.id, {"key": "k" * 64, "estimates": {"a": 1.5}})
    assert repo.get_study("kept").pooled_cache == {"key": "k" * 64, "estimates": {"a": 1.5}}
    assert repo.get_study("kept").updated_at == study.updated_at  # a cache is no change of the study
    repo.close()
    downgrade(engine, "0004_optuna_names_numbering")
    assert "pooled_cache" not in {c["name"] for c in inspect(engine).get_columns("autotune_studies")}
    with engine.connect() as c:
        assert c.execute(text("SELECT name FROM autotune_studies")).scalars().all() == ["kept"]
        assert c.execute(text("SELECT COUNT(*) FROM autotune_trials")).scalar() == 1  # no cascade on the way down
    upgrade(engine)
    repo = Repository.open(storage_url)
    assert repo.get_study("kept").pooled_cache is None
    repo.close()


def test_0006_adds_the_measured_terms_and_its_downgrade_drops_only_that(storage_url):
    """A 0005 store upgrades (a column added in place); a downgrade keeps every study and trial and drops
    the column, and the trials read without measured parts after the next upgrade."""
    engine = make_engine(storage_url)
    upgrade(engine, "0005_study_pooled_cache")
    upgrade(engine)
    repo = Repository.open(storage_url)
    study = new_study(repo, name="old")
    trial = repo.claim_dispatch(study.id, {"tp": 2}, "k1", 1, "c", 3)
    repo.finish_trial(study.id, trial.number, "completed", metrics={"step_time_s": 30.0},
                      measured_terms_s={"compute": 20.0, "exposed_communication": 4.0})
    assert repo.trial(study.id, trial.number).measured_terms_s == {"compute": 20.0, "exposed_communication": 4.0}
    repo.close()
    downgrade(engine, "0005_study_pooled_cache")
    assert "measured_terms_s" not in {c["name"] for c in inspect(engine).get_columns("autotune_trials")}
    with engine.connect() as c:
        assert c.execute(text("SELECT COUNT(*) FROM autotune_trials")).scalar() == 1
    upgrade(engine)
    repo = Repository.open(storage_url)
    assert repo.trial(study.id, trial.number).measured_terms_s is None
    repo.close()


@pytest.mark.parametrize("stored", ['{"compute": "fast"}', '[1, 2]', '{"compute": 1e308}', '{"compute": -1}',
                                    '{"magic": 1.0}', '"text"'])
def test_measured_terms_autotune_would_not_write_read_as_none(storage_url, stored):
    """Advisory, like the prediction: a hand-edited breakdown is no measurement, and refuses nothing."""
    repo = Repository.open(storage_url)
    study = new_study(repo, name="edited")
    trial = repo.claim_dispatch(study.id, {"tp": 2}, "k1", 1, "c", 3)
    repo.finish_trial(study.id, trial.number, "completed", metrics={"step_time_s": 30.0})
    with repo.engine.begin() as c:
        c.execute(text("UPDATE autotune_trials SET measured_terms_s = :v"), {"v": stored})
    assert repo.trial(study.id, trial.number).measured_terms_s is None
    assert [t.number for t in repo.trials(study.id)] == [trial.number]
    repo.close()


def test_a_pooling_cache_autotune_cannot_read_is_no_cache_not_a_refused_study(storage_url):
    """Review: a hand-edited cache refused the study, and with it every listing of the store."""
    repo = Repository.open(storage_url)
    study = new_study(repo, name="edited")
    with repo.engine.begin() as c:
        c.execute(text("UPDATE autotune_studies SET pooled_cache = :v WHERE id = :i"),
                  {"v": json.dumps([1, 2]), "i": study.id})
    assert repo.get_study("edited").pooled_cache is None
    assert [s.name for s in repo.list_studies()] == ["edited"]
    repo.close()
