"""A store edited by hand, or by an attacker with write access to it: every command says what it cannot use in one
line (exit 2) and changes nothing, the other studies stay readable, and no password of a store's URL is printed.

Found by an adversarial pass over the storage boundary (2026-11-29): a study pointed at another study's Optuna
study, stored options and backend options autotune cannot run with, a heartbeat in the year 9999, one bad row
hiding every study from `status`, a version table of two rows, passwords in URL queries and driver errors, and two
processes creating the schema of a fresh PostgreSQL database at once.
"""

from __future__ import annotations

import sqlite3

import optuna
import pytest

from autotune.controller.session import build_controller, create_study
from autotune.space import load_space, make_workload
from autotune.storage import Repository
from tests.conftest import POSTGRES_URL, _postgres_available, run_cli, run_in_threads

ENV = {"RAY_AUTH_MODE": "disabled"}


@pytest.fixture(scope="module")
def two_studies(tmp_path_factory):
    """A SQLite store with two finished simulated studies, A and B (3 runs each); tests copy it."""
    path = tmp_path_factory.mktemp("hostile") / "store.db"
    repo = Repository.open(f"sqlite:///{path}")
    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    for name in ("A", "B"):
        study = create_study(repo, name=name, space=space, workload=workload, budget=3, sampler="auto",
                             backend="simulate", backend_options={"seconds_per_trial": 0.0}, seed=0)
        build_controller(repo, study, dispatcher="inprocess").run()
    repo.close()
    with sqlite3.connect(path) as db:  # everything into the file itself: the tests copy the file alone
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return path


def _copy(two_studies, tmp_path, *statements: str) -> str:
    path = tmp_path / "edited.db"
    path.write_bytes(two_studies.read_bytes())
    with sqlite3.connect(path) as db:
        for statement in statements:
            db.executescript(statement) if ";" in statement else db.execute(statement)
    db.close()
    return str(path)


def _dump(path: str) -> list:
    with sqlite3.connect(path) as db:
        rows = [db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall() for table in
                ("autotune_studies", "autotune_trials", "trials", "studies")]
    db.close()
    return rows


@pytest.mark.parametrize("edit, needle", [
    # resume wrote into B's Optuna study
    ("UPDATE autotune_studies SET optuna_study_name = 'B', budget = 5 WHERE name = 'A'", "optuna_study_name"),
    # a traceback, the study left running; every run timed out; numpy's TypeError
    ("UPDATE autotune_studies SET options = json_set(options, '$.trial_timeout_s', 'abc'), budget = 5 "
     "WHERE name = 'A'", "options"),
    ("UPDATE autotune_studies SET options = json_set(options, '$.trial_timeout_s', -5), budget = 5 WHERE name = 'A'",
     "options"),
    ("UPDATE autotune_studies SET options = json_set(options, '$.seed', 'x'), budget = 5 WHERE name = 'A'", "options"),
    ("UPDATE autotune_studies SET options = json_set(options, '$.max_gpu_hours', -1), budget = 5 WHERE name = 'A'",
     "options"),
    # a stored start-up of null: float(None)'s TypeError after Ray had started (review)
    ("UPDATE autotune_studies SET backend_options = '{\"startup_s\": null}', budget = 5 WHERE name = 'A'",
     "simulate backend option startup_s"),
    # every resumed run failed with the backend's ValueError stored as its message
    ("UPDATE autotune_studies SET backend_options = '{\"noise\": \"loud\"}', budget = 5 WHERE name = 'A'",
     "simulate backend option noise"),
    # its Optuna study gone (deleted, or renamed as here): made anew, empty, then "could not allocate a trial
    # number after 50 attempts" with the study left running
    ("UPDATE studies SET study_name = 'gone' WHERE study_name = 'A'; UPDATE autotune_studies SET budget = 5 "
     "WHERE name = 'A'", "Optuna study 'A' of this study is not in the store"),
])
def test_resume_refuses_a_study_it_cannot_run_as_stored_and_changes_nothing(two_studies, tmp_path, edit, needle):
    path = _copy(two_studies, tmp_path, edit)
    before = _dump(path)
    done = run_cli("resume", "A", "--storage", f"sqlite:///{path}", env=ENV, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1 and needle in done.stderr
    assert _dump(path) == before
    assert len(optuna.load_study(study_name="B", storage=f"sqlite:///{path}").trials) == 3


def test_a_heartbeat_in_the_future_is_stale_not_a_live_controller(two_studies, tmp_path):
    """`resume` waited for ever for a run whose (hand-edited) heartbeat lay in the year 9999."""
    path = _copy(two_studies, tmp_path,
                 "UPDATE autotune_studies SET budget = 4, status = 'interrupted' WHERE name = 'A'",
                 "UPDATE autotune_trials SET status = 'dispatched', heartbeat_at = '9999-12-31 23:59:59.000000', "
                 "controller_id = 'ghost', step_time_s = NULL, tokens_per_s_per_gpu = NULL, tflops_per_gpu = NULL, "
                 "mfu = NULL, peak_mem_gib = NULL, finished_at = NULL "
                 "WHERE number = 2 AND study_id = (SELECT id FROM autotune_studies WHERE name = 'A')")
    done = run_cli("resume", "A", "--storage", f"sqlite:///{path}", "--json", env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    repo = Repository.open(f"sqlite:///{path}", create=False)
    study = repo.get_study("A")
    trial = repo.trial(study.id, 2)
    assert trial.status == "completed" and trial.controller_id != "ghost" and study.status == "finished"
    repo.close()


def test_status_lists_the_other_studies_when_one_holds_a_row_it_cannot_read(two_studies, tmp_path):
    for edit in ("UPDATE autotune_trials SET gpu_seconds = -5 WHERE number = 1 AND "
                 "study_id = (SELECT id FROM autotune_studies WHERE name = 'A')",
                 "UPDATE autotune_studies SET workload = '[1, 2]' WHERE name = 'A'",
                 "UPDATE autotune_studies SET options = '{bad' WHERE name = 'A'"):  # no JSON: fails the row's load
        path = _copy(two_studies, tmp_path, edit)
        done = run_cli("status", "--storage", f"sqlite:///{path}", env={**ENV, "COLUMNS": "200"})
        assert done.returncode == 0, done.stderr
        assert "│ B " in done.stdout and "A: cannot be shown" in " ".join(done.stdout.split())


def test_a_version_table_of_two_rows_is_one_line_everywhere(two_studies, tmp_path):
    path = _copy(two_studies, tmp_path, "INSERT INTO autotune_alembic_version VALUES ('0004_optuna_numbering')")
    for argv in (["status"], ["db", "current"], ["db", "upgrade"]):
        done = run_cli(*argv, "--storage", f"sqlite:///{path}", env=ENV)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (argv, done.stderr[-1500:])
        assert len(done.stderr.strip().splitlines()) == 1 and "not one revision" in done.stderr, done.stderr


@pytest.mark.parametrize("url", [
    "postgresql://postgres@127.0.0.1:5432/no_such_db_autotune?password=QSECRET",  # libpq's query form
    "postgresql+psycopg2://u:QSECRET@127.0.0.1/db",  # a driver that is not installed: its message quoted the URL
    "postgresql://u:QSECRET@127.0.0.1:abc/db",  # a URL that does not parse
])
def test_no_password_of_a_storage_url_is_printed(url):
    for env in ({}, {"AUTOTUNE_STORAGE": url}):
        done = run_cli("status", *(["--storage", url] if not env else []), env={**ENV, **env})
        assert done.returncode == 2 and "QSECRET" not in done.stderr + done.stdout, done.stderr
        assert "***" in done.stderr


@pytest.mark.skipif(not _postgres_available(), reason="no PostgreSQL server on 127.0.0.1:5432")
def test_two_processes_creating_a_fresh_postgres_schema_at_once_both_succeed():
    """The loser of the race failed ('duplicate key ... pg_type', or 'autotune tables but no version table'); the
    schema is now made under an advisory lock, and the second opener finds it made."""
    import psycopg

    name = "autotune_schema_race"
    admin = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        connection.execute(f"CREATE DATABASE {name}")
    url = POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        for _ in range(3):
            assert run_in_threads(lambda: Repository.open(url).close(), 2, timeout_s=120) == []
            with psycopg.connect(admin.replace("dbname=postgres", f"dbname={name}"), autocommit=True) as connection:
                connection.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_two_openers_creating_a_fresh_sqlite_store_at_once_both_succeed(tmp_path):
    """Review: SQLite's locks hold each transaction, not the migration: two processes opening one fresh file at once
    failed in 13 of 40 opens ("table already exists", "autotune tables but no autotune_alembic_version"). The schema
    is now made under an flock of the file, and the switch of a fresh file to WAL mode is tried again when the other
    opener holds it for that instant ("database is locked" in 20 of 120 opens)."""
    for attempt in range(8):
        url = f"sqlite:///{tmp_path / f'fresh{attempt}.db'}"
        assert run_in_threads(lambda url=url: Repository.open(url).close(), 2, timeout_s=120) == []


def test_what_start_and_the_python_api_store_is_read_back():
    """Second review: the options rule first refused a seed above 10**9 (`start --seed` takes up to 2**32 - 1) and a
    slow margin of 0 (a test's own study), which would have made such stores unreadable."""
    from autotune.controller.options import StudyOptions
    from autotune.storage._engine import shown_url
    from autotune.storage._records import check_study_values

    for options in ({"seed": 2 ** 32 - 1}, {"seed": None}, {"slow_margin": 0.0, "warmup_steps": 0},
                    {"knob_share": 0.8, "memory_headroom_gib": 0.0, "benchmark_settings": {}},
                    StudyOptions(seed=7).to_stored()):
        values = {"name": "s", "optuna_study_name": "autotune:s", "options": options}
        assert check_study_values(values) is values
    # a query key that merely ends like one that holds a password is shown (review: `compass=1` was hidden)
    shown = shown_url("postgresql+psycopg://u@h/db?compass=1&password=x&sslpassword=y")
    assert "compass=1" in shown and "password=***" in shown and "sslpassword=***" in shown and "=x" not in shown


def test_import_log_refuses_a_study_whose_optuna_study_is_gone(two_studies, tmp_path):
    path = _copy(two_studies, tmp_path, "UPDATE studies SET study_name = 'gone' WHERE study_name = 'A'")
    from tests.workers.test_workers import LOG

    log = tmp_path / "run.log"
    log.write_text(LOG)
    before = _dump(path)
    done = run_cli("import-log", str(log), "--study", "A", "--storage", f"sqlite:///{path}", "--tp", "2", "--ep",
                   "8", "--sp", "--dist-opt", env=ENV, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "Optuna study 'A' of this study is not in the store" in done.stderr
    assert _dump(path) == before


@pytest.mark.parametrize("cancel_raises", [False, True], ids=["cancel-works", "cancel-raises"])
def test_a_study_stopped_by_an_error_is_left_interrupted_not_running(tmp_path, cancel_raises):
    """Found by the storage pass: an error inside the loop (a store refusing a write, Ray losing a node) left the
    study `running` with its runs dispatched, shown live until their heartbeats went stale. Review: also when the
    cancel of a run in flight raised too (Ray gone)."""
    from autotune.dispatch._inprocess import InProcessDispatcher
    from autotune.storage import StudyStatus

    repo = Repository.open(f"sqlite:///{tmp_path / 'store.db'}")
    space = load_space("qwen3_30b")
    study = create_study(repo, name="S", space=space, workload=make_workload(space, gpus=16), budget=6,
                         sampler="auto", backend="simulate", backend_options={"seconds_per_trial": 0.0}, seed=0)

    class Dispatcher(InProcessDispatcher):
        def cancel(self, number):
            if cancel_raises:
                raise RuntimeError("Ray is gone")
            super().cancel(number)

    in_flight = []

    def fail_with_runs_in_flight(controller):
        if controller.running:
            in_flight.extend(controller.running)
            raise RuntimeError("Ray lost its node")

    controller = build_controller(repo, study, on_tick=fail_with_runs_in_flight,
                                  dispatcher=Dispatcher("simulate", {"seconds_per_trial": 0.0}, concurrency=3))
    with pytest.raises(RuntimeError, match="lost its node"):
        controller.run()
    assert in_flight and repo.get_study("S").status == StudyStatus.INTERRUPTED
    stopped = [t for t in repo.trials(study.id) if t.number in in_flight]
    assert stopped and all(t.status == "dispatched" and t.heartbeat_at is None for t in stopped)  # shown stopped
    repo.close()


def test_a_broken_optuna_table_is_one_line_not_a_page_of_tracebacks(two_studies, tmp_path):
    """Optuna's storage errors reach the top as one line (our own store's errors were already StorageErrors):
    a hand-renamed column of Optuna's `trials` table was a page of chained tracebacks."""
    path = _copy(two_studies, tmp_path, "ALTER TABLE trials RENAME COLUMN state TO st; "
                                        "UPDATE autotune_studies SET budget = 5 WHERE name = 'A'")
    done = run_cli("resume", "A", "--storage", f"sqlite:///{path}", env=ENV, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "autotune resume: error: the store failed (in Optuna's storage): no such column: trials.state"], done.stderr
    with sqlite3.connect(path) as db:  # review: the error came before the loop's try, the study left running
        assert db.execute("SELECT status FROM autotune_studies WHERE name = 'A'").fetchone() == ("interrupted",)
    db.close()


@pytest.mark.parametrize("tables, refused", [
    (["CREATE TABLE users (id INTEGER)"], "another application's tables (users)"),
    # a `trials` table that is not Optuna's (no version_info beside it): Optuna's first query failed
    (["CREATE TABLE trials (id INTEGER)"], "another application's tables (trials)"),
    ([], None),  # an empty SQLite file is an empty database: the store is made in it
])
def test_start_refuses_another_applications_sqlite_file_and_leaves_it_as_it_was(tmp_path, tables, refused):
    """Found by the storage pass: `start --storage sqlite:///app.db` added autotune's and Optuna's tables to
    another application's database and switched it to WAL mode."""
    path = tmp_path / "app.db"
    path.touch()
    with sqlite3.connect(path) as db:
        for statement in tables:
            db.execute(statement)
    db.close()
    before = path.read_bytes()
    done = run_cli("start", "--model", "qwen3_30b", "--budget", "1", "--storage", f"sqlite:///{path}", "--study",
                   "S", "--sim-seconds", "0", "--json", env=ENV, timeout=300)
    if refused is None:
        assert done.returncode == 0, done.stderr[-2000:]
        return
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and refused in done.stderr, done.stderr
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def test_start_shares_an_optuna_store(tmp_path):
    """A SQLite file of the user's own Optuna studies is a store autotune may share: both studies are there."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    optuna.create_study(storage=url, study_name="mine").optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    done = run_cli("start", "--model", "qwen3_30b", "--budget", "1", "--storage", url, "--study", "S",
                   "--sim-seconds", "0", "--json", env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(optuna.get_all_study_names(url)) == ["S", "mine"]


def test_the_optuna_table_list_is_the_installed_optunas():
    from optuna.storages._rdb import models

    from autotune.storage._engine import OPTUNA_TABLES, OPTUNA_VERSION_TABLE

    assert set(models.BaseModel.metadata.tables) | {"alembic_version"} == OPTUNA_TABLES
    assert OPTUNA_VERSION_TABLE in OPTUNA_TABLES


def test_an_optuna_store_of_another_optuna_schema_is_refused_before_autotune_writes_to_it(tmp_path):
    """Review: a file of the user's Optuna studies made by an older Optuna got autotune's tables and WAL mode, then
    Optuna's RuntimeError ("execute optuna storage upgrade") as a traceback, exit 1."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    optuna.create_study(storage=url, study_name="mine")
    with sqlite3.connect(tmp_path / "old.db") as db:
        db.execute("UPDATE alembic_version SET version_num = 'v3.0.0.d'")
    db.close()
    before = (tmp_path / "old.db").read_bytes()
    done = run_cli("start", "--model", "qwen3_30b", "--budget", "1", "--storage", url, "--sim-seconds", "0", env=ENV,
                   timeout=300)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert "Optuna's schema v3.0.0.d" in done.stderr and "optuna storage upgrade --storage" in done.stderr
    assert (tmp_path / "old.db").read_bytes() == before


def test_an_autotune_store_whose_optuna_tables_are_of_another_optuna_is_one_line(two_studies, tmp_path):
    """The same after the fact (an Optuna upgraded under an existing store): Optuna's RuntimeError is one line."""
    path = _copy(two_studies, tmp_path, "UPDATE alembic_version SET version_num = 'v3.0.0.d'; "
                                        "UPDATE autotune_studies SET budget = 5 WHERE name = 'A'")
    done = run_cli("resume", "A", "--storage", f"sqlite:///{path}", env=ENV, timeout=300)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert "optuna storage upgrade" in done.stderr and "Traceback" not in done.stderr
