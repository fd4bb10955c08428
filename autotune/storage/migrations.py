"""Running autotune's Alembic migrations programmatically (no alembic.ini needed).

`ensure_schema` is what every command that opens storage calls: it creates the schema of an empty
database, and refuses (StorageError, one line) a database whose schema is older ("run autotune db
upgrade") or newer ("upgrade autotune") than this code.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

from autotune.errors import StorageError

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic is imported where a migration runs or the revisions are read, not when a store at this code's
# revision opens: with Mako and Pygments it costs ~0.3 s of every read command's start-up.

VERSION_TABLE = "autotune_alembic_version"


def migrations_dir() -> Path:
    """The Alembic script directory: installed as autotune/migrations, or the checkout's alembic/."""
    package_dir = Path(__file__).resolve().parent.parent
    for candidate in (package_dir / "migrations", package_dir.parent / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("autotune's Alembic migrations are missing from this installation")


def _config(engine: Engine) -> "Config":
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("version_table", VERSION_TABLE)
    return config


def head_revision(engine: Engine) -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config(engine)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext
    from alembic.util.exc import CommandError

    with engine.connect() as connection:
        try:
            return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()
        except CommandError as exc:  # two rows in the version table (a hand edit, found by an adversarial pass)
            raise StorageError(f"the database's {VERSION_TABLE} is not one revision ({exc}): autotune does not "
                               "write that (was it edited by hand?); nothing was changed") from None


# PostgreSQL: one schema change at a time, across every process sharing the database (found by an adversarial
# pass: two `start` or `db upgrade` on a fresh database raced to create the tables, and the loser failed)
_SCHEMA_LOCK_KEY = 0x6175746F74756E  # "autotun"


@contextlib.contextmanager
def _schema_lock(engine: Engine):
    if engine.dialect.name == "sqlite":
        with _sqlite_schema_lock(engine):
            yield
        return
    if engine.dialect.name != "postgresql":
        yield
        return
    # autocommit: a session-level lock needs no transaction, and one left open while the migration runs is
    # "idle in transaction", which a server's idle_in_transaction_session_timeout kills (review)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as lock:
        lock.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _SCHEMA_LOCK_KEY})
        try:
            yield
        finally:
            lock.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _SCHEMA_LOCK_KEY})


@contextlib.contextmanager
def _sqlite_schema_lock(engine: Engine):
    """SQLite: an exclusive flock on the store's folder while its schema is made or upgraded. SQLite's own locks
    hold each transaction, not the whole migration (review: two processes opening one fresh file at once failed
    in 13 of 40 opens, "table already exists" or "autotune tables but no autotune_alembic_version").

    The folder, not the file: SQLite locks the file with POSIX fcntl locks, which a process loses all of when it
    closes any descriptor of that file (a first version locked the file itself, and its close dropped the locks of
    the process's open connections); a folder's descriptor touches none of them. Other stores of the folder wait
    for the few statements of a schema change, no more."""
    import fcntl
    import os

    database = engine.url.database
    try:
        fd = os.open(os.path.dirname(os.path.abspath(database)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) \
            if database else None
    except OSError:  # a folder not openable here: the transactions' own locks, as before
        fd = None
    if fd is None:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases its flock


def upgrade(engine: Engine, revision: str = "head") -> None:
    with _schema_lock(engine):
        _upgrade(engine, revision)


def upgrade_from(engine: Engine) -> tuple[str | None, str | None]:
    """`db upgrade`: (the revision before, after), read, refused (unversioned autotune tables) and upgraded under
    the schema lock, so that another process creating the schema meanwhile is seen, not raced."""
    with _schema_lock(engine):
        before = current_revision(engine)
        if before is None:
            refuse_unversioned_tables(engine)
        _upgrade(engine)
        return before, current_revision(engine)


def _upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    config = _config(engine)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Back to `revision` (for an older autotune on the same database); each migration keeps the data
    that revision's code reads."""
    from alembic import command

    config = _config(engine)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def refuse_unversioned_tables(engine: Engine) -> None:
    """StorageError when the database holds autotune's tables without its version table: not made by
    autotune's migrations, so neither read nor migrated (creating the schema there would collide)."""
    if inspect(engine).has_table("autotune_trials"):
        raise StorageError("the database has autotune tables but no autotune_alembic_version: "
                           "it was not created by autotune's migrations")


def stamped_revision(engine: Engine) -> str | None:
    """The one revision in autotune's version table, read with plain SQL (None: no table, or not one row)."""
    with engine.connect() as connection:
        if not inspect(connection).has_table(VERSION_TABLE):
            return None
        rows = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    return rows[0] if len(rows) == 1 else None


def is_newer(engine: Engine, revision: str) -> bool:
    """A revision this code does not know: written by a newer autotune (`db upgrade` cannot help)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_config(engine))
    return revision not in {rev.revision for rev in script.walk_revisions()}


def ensure_schema(engine: Engine) -> None:
    """Create the schema in an empty database; refuse one that is behind or ahead of this code."""
    from autotune.storage.models import SCHEMA_REVISION

    if stamped_revision(engine) == SCHEMA_REVISION:  # the usual case, decided without Alembic
        return
    with _schema_lock(engine):  # decided and done under the lock: another process may be creating it now
        _ensure_schema(engine)


def _ensure_schema(engine: Engine) -> None:
    current = current_revision(engine)
    head = head_revision(engine)
    if current == head:
        return
    if current is None:
        refuse_unversioned_tables(engine)
        _upgrade(engine)
        return
    if is_newer(engine, current):
        raise StorageError(f"the database schema is at revision {current}, newer than this autotune ({head}): "
                           "upgrade autotune to use it")
    raise StorageError(f"the database schema is at revision {current}, older than this autotune ({head}): "
                       "run `autotune db upgrade --storage URL` first")
