"""The repository and migrations, on a real SQLite file and the real PostgreSQL server."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import inspect, text

from autotune.errors import StorageError, StudyError
from autotune.storage import Repository, current_revision, head_revision, make_engine, upgrade
from autotune.storage.migrations import VERSION_TABLE, downgrade


def new_study(repo: Repository, name: str = "s", budget: int = 3):
    return repo.create_study(name=name, model="qwen3_30b", workload={"gpus": 16}, space={"domains": {}},
                             budget=budget, sampler="auto", backend="simulate", backend_options={}, options={},
                             optuna_study_name=f"autotune:{name}", status="created")


def test_schema_is_created_with_our_version_table(storage_url):
    repo = Repository.open(storage_url)
    tables = set(inspect(repo.engine).get_table_names())
    assert {"autotune_studies", "autotune_trials", VERSION_TABLE} <= tables
    assert "alembic_version" not in tables  # that name belongs to Optuna
    assert current_revision(repo.engine) == head_revision(repo.engine)


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
    first = repo.claim_dispatch(study.id, {"tp": 1}, "k1", 0, "c1", study.budget)
    assert first.number == 1 and first.status == "dispatched" and first.controller_id == "c1"
    assert repo.claim_dispatch(study.id, {"tp": 1}, "k1", 1, "c1", study.budget) == "duplicate"
    repo.add_rejected(study.id, {"tp": 3}, "k3", "heads_divisible_by_tp", "32 heads / TP 3", 2)
    second = repo.claim_dispatch(study.id, {"tp": 2}, "k2", 3, "c1", study.budget)
    assert second.number == 3  # numbers are shared with rejected proposals
    assert repo.claim_dispatch(study.id, {"tp": 4}, "k4", 4, "c1", study.budget) == "budget"
    counts = repo.counts(study.id)
    assert counts["dispatched"] == 2 and counts["rejected"] == 1 and counts["running"] == 2


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
    assert repo.adopt_trial(study.id, trial.number, "me", cutoff)
    assert not repo.adopt_trial(study.id, trial.number, "other", utcnow() - dt.timedelta(seconds=60))


def test_upgrade_from_the_first_released_schema(storage_url):
    """A database created by revision 0001 (the first released schema) upgrades with its data."""
    engine = make_engine(storage_url)
    upgrade(engine, "0001_initial")
    with engine.begin() as c:
        c.execute(text("INSERT INTO autotune_studies (name, model, workload, space, budget, sampler, backend, "
                       "backend_options, options, optuna_study_name, status, created_at, updated_at) VALUES "
                       "('old', 'qwen3_30b', '{}', '{}', 5, 'auto', 'simulate', '{}', '{}', 'autotune:old', "
                       "'finished', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
    with pytest.raises(StorageError, match="autotune db upgrade"):
        Repository.open(storage_url)
    upgrade(engine)
    repo = Repository.open(storage_url)
    assert repo.get_study("old").budget == 5
    columns = {c["name"] for c in inspect(repo.engine).get_columns("autotune_trials")}
    assert {"predicted", "controller_id"} <= columns


def test_upgrade_to_0003_moves_origin_and_worker_losses_out_of_other_fields(storage_url):
    """0003 turns the strategy notes that were types into origins and the artifacts' loss count into a column."""
    engine = make_engine(storage_url)
    upgrade(engine, "0002_trial_prediction_owner")
    with engine.begin() as c:
        c.execute(text("INSERT INTO autotune_studies (id, name, model, workload, space, budget, sampler, backend, "
                       "backend_options, options, optuna_study_name, status, created_at, updated_at) VALUES "
                       "(1, 'old', 'qwen3_30b', '{}', '{}', 5, 'auto', 'simulate', '{}', '{}', 'autotune:old', "
                       "'finished', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
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
