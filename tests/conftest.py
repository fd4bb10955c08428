"""Shared fixtures. Ray is started once per session (per pytest-xdist worker: two, pyproject.toml), never per test."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def run_cli(*args: str, stdin: str | None = None, env: dict | None = None, timeout: float = 120, cwd=None):
    """Run the real `autotune` command in a subprocess; returns the CompletedProcess."""
    # a developer's exported $COLUMNS would narrow piped tables in tests that expect the default width
    full_env = {**{k: v for k, v in os.environ.items() if k != "COLUMNS"}, **(env or {})}
    # no stdin given: an empty one (not pytest's, which a CI runner may leave a pipe with data: `check` refuses
    # knob flags and stdin text together)
    stdin_kwargs = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
    return subprocess.run([sys.executable, "-m", "autotune", *args], **stdin_kwargs, capture_output=True,
                          text=True, env=full_env, timeout=timeout, cwd=cwd)


def json_lines(text: str) -> list:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def cli():
    return run_cli


FAKE_LAUNCHER = os.path.join(os.path.dirname(__file__), "fixtures", "fake_launcher.py")
# pytest-xdist runs the suite in two processes (README): each gets a database of its own on the server
# ($AUTOTUNE_TEST_POSTGRES's or the local one's, named after it with the worker's id), since the fixture below drops
# every table of its database before each test (two workers on one database broke each other's tests)
POSTGRES_BASE_URL = os.environ.get("AUTOTUNE_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def _worker_url(base: str) -> str:
    from sqlalchemy.engine import make_url

    url = make_url(base)
    return url.set(database=f"{url.database}_{_WORKER}").render_as_string(hide_password=False) if _WORKER else base


POSTGRES_URL = _worker_url(POSTGRES_BASE_URL)
_POSTGRES_MISSING: list[str] = []  # why _postgres_available said no: the skip says it


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole test session: 16 logical GPUs on this CPU machine."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, num_gpus=16, namespace="autotune", include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
    yield ray
    ray.shutdown()


@functools.cache
def _postgres_available() -> bool:
    """The server answers, with this process's database (an xdist worker's made on first use, through the
    base URL's database)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    try:
        if POSTGRES_URL != POSTGRES_BASE_URL:
            name = make_url(POSTGRES_URL).database
            engine = create_engine(POSTGRES_BASE_URL, isolation_level="AUTOCOMMIT",
                                   connect_args={"connect_timeout": 3})
            try:
                with engine.connect() as connection:
                    def exists() -> bool:
                        query = text("SELECT 1 FROM pg_database WHERE datname = :n")
                        return connection.execute(query, {"n": name}).first() is not None

                    if not exists():
                        try:
                            connection.execute(text('CREATE DATABASE "{}"'.format(name.replace('"', '""'))))
                        except Exception:  # another session made it since the check: it exists, which is all we need
                            if not exists():
                                raise
            finally:
                engine.dispose()
        engine = create_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
        try:
            with engine.connect():
                return True
        finally:
            engine.dispose()
    except Exception as exc:
        _POSTGRES_MISSING.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return False


@pytest.fixture
def postgres_url():
    """A clean PostgreSQL database (the server on 127.0.0.1:5432); autotune's and Optuna's tables dropped."""
    if not _postgres_available():
        pytest.skip(f"no PostgreSQL database at {POSTGRES_URL}: {_POSTGRES_MISSING[0] if _POSTGRES_MISSING else '?'}")
    from sqlalchemy import create_engine, text

    engine = create_engine(POSTGRES_URL)
    with engine.begin() as connection:
        connection.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public;"))
    engine.dispose()
    return POSTGRES_URL


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request, tmp_path):
    """Every storage test runs on a real SQLite file and on the real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'autotune.db'}"
    return request.getfixturevalue("postgres_url")


def wait_for_study(path, name: str, process, timeout_s: float = 120.0) -> None:
    """Until the SQLite store at `path` holds study `name` (`autotune start` stores it once Ray is up), or
    the process ended, or `timeout_s` passed (AssertionError). Tests that kill a start wait for this first."""
    import sqlite3
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                if db.execute("SELECT 1 FROM autotune_studies WHERE name = ?", (name,)).fetchone():
                    return
        except sqlite3.Error:  # not there yet, or its schema not yet written
            pass
        time.sleep(0.2)
    raise AssertionError(f"study {name!r} was not stored within {timeout_s:g} s")


def run_in_threads(target, count: int = 2, timeout_s: float = 600.0) -> list[BaseException]:
    """Run `target` in `count` threads started together (a barrier), wait for them, and return what they raised."""
    import threading

    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def run() -> None:
        try:
            barrier.wait()
            target()
        except BaseException as exc:  # noqa: BLE001 - returned to the test, which asserts on it
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout_s)
    return errors


def allow_runs(repo, study_id: int, budget: int) -> None:
    """Raise a study's stored budget, for a test that records more runs than the study was made with
    (claim_dispatch honours the stored budget, whatever budget its caller read)."""
    from sqlalchemy import update

    from autotune.storage.models import StudyRow

    with repo.session() as s:
        s.execute(update(StudyRow).where(StudyRow.id == study_id).values(budget=budget))
