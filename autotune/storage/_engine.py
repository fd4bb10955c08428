"""Storage URLs and engines: SQLite in WAL mode with a busy timeout, or PostgreSQL through psycopg 3.

The default store is a SQLite file in the user's data directory ($AUTOTUNE_HOME, else
$XDG_DATA_HOME/autotune, else ~/.local/share/autotune), overridden by --storage or AUTOTUNE_STORAGE.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError

from autotune.errors import StorageError

STORAGE_ENV = "AUTOTUNE_STORAGE"
SQLITE_BUSY_TIMEOUT_S = 30


def data_dir() -> Path:
    if os.environ.get("AUTOTUNE_HOME"):
        return Path(os.environ["AUTOTUNE_HOME"])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "autotune"


def default_storage_url() -> str:
    return os.environ.get(STORAGE_ENV) or f"sqlite:///{data_dir() / 'autotune.db'}"


SECRET_QUERY_KEYS = ("password", "passwd", "pass", "sslpassword")


def _hide_query_passwords(text: str) -> str:
    """`text` with the value of every `password=`-like parameter (SECRET_QUERY_KEYS, as a whole word) as ***."""
    import re

    return re.sub(r"(?i)(?<![a-z0-9_])((?:" + "|".join(SECRET_QUERY_KEYS) + r")=)[^&\s]*", r"\1***", text)


def shown_url(url) -> str:
    """A store's URL (text or a SQLAlchemy URL) as autotune prints it: the password hidden whether it is in the
    user part or a query parameter (libpq's `?password=`), even in a URL that does not parse, and on one line
    (found by an adversarial pass: a query password, a malformed URL's and a missing driver's message showed it)."""
    import re

    from autotune._paths import one_line

    try:
        parsed = url if hasattr(url, "render_as_string") else make_url(str(url))
        query = {k: ("***" if k.lower() in SECRET_QUERY_KEYS else v) for k, v in parsed.query.items()}
        shown = parsed.set(query=query).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads: hide what looks like a password all the same
        shown = re.sub(r"(://[^/@:]*:)[^@/]*@", r"\1***@", str(url))
    return one_line(_hide_query_passwords(shown))


def normalize_url(url: str) -> str:
    """Check the URL's form and pick our driver: postgresql:// means psycopg 3 here."""
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 - a port that is not a number raises ValueError here, not at connect time
    except (ArgumentError, ValueError):
        raise StorageError(f"--storage '{shown_url(url)}' is not a database URL (e.g. sqlite:///path.db, "
                           "postgresql+psycopg://user@host/db)") from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise StorageError(f"--storage: unsupported database {backend!r} (use sqlite or postgresql)")
    if backend == "sqlite" and parsed.query:
        # pysqlite would ignore ?mode=ro (with a warning) and write anyway; a `file:` URI would become a
        # folder named `file:`: a SQLite store is a plain path
        raise StorageError(f"--storage '{shown_url(url)}': a SQLite URL takes no options (?{'&'.join(parsed.query)}); "
                           "give the file's path, e.g. sqlite:///path.db")
    if backend == "sqlite" and (not parsed.database or parsed.database == ":memory:"):
        # every connection (the controller's, Optuna's, a reader's) would open its own empty database
        raise StorageError(f"--storage '{shown_url(url)}': an in-memory SQLite database cannot hold a study; give a file, "
                           "e.g. sqlite:///path.db")
    if backend == "sqlite" and (parsed.database or "").startswith("~"):
        # SQLite itself would open a folder named `~` under the current one, not the home the user means
        # (and the file checked before opening would be another one than the file opened)
        try:
            parsed = parsed.set(database=str(Path(parsed.database).expanduser()))
        except RuntimeError:  # `~nosuchuser/x.db`
            raise StorageError(f"--storage '{shown_url(url)}': {parsed.database.split('/')[0]!r} names no home folder here") from None
    if backend == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for PostgreSQL and in-memory SQLite)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)  # normalize_url expanded a leading ~ already


def prepare_sqlite_file(url: str, create: bool) -> None:
    """_prepare_sqlite_file, with a path the OS refuses outright (a part over 255 bytes: ENAMETOOLONG, which
    Path.is_file raises rather than answers) said in one line (found by an adversarial pass: a traceback)."""
    try:
        _prepare_sqlite_file(url, create)
    except OSError as exc:
        from autotune._paths import shown

        raise StorageError(f"cannot use the store {shown(str(sqlite_path(url)))}: {exc.strerror or exc}") from None


def _prepare_sqlite_file(url: str, create: bool) -> None:
    """Make the SQLite file's folder (create) or insist the file exists (read-only commands).

    A read-only command must not leave a new empty store (and its folders) behind a typo; a folder
    that cannot be made is one line, not a FileExistsError / PermissionError traceback.
    """
    path = sqlite_path(url)
    if path is None:
        return
    if not str(path).isprintable():  # a NUL or an escape sequence would reach the error and the terminal
        raise StorageError(f"--storage: the SQLite path {str(path)[:80]!r} holds a character that is not "
                           "printable (a control character, a line or paragraph separator, a no-break space...)")
    if not create:
        if not path.is_file():
            raise StorageError(f"no autotune store at {path} (nothing to read; `autotune start` creates one)")
        _require_store_file(path)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise StorageError(f"cannot create the store {path}: a file is in the way of its folder") from None
    except OSError as exc:
        raise StorageError(f"cannot create the folder of the store {path}: {exc.strerror}") from None
    if path.exists() and not path.is_file():
        raise StorageError(f"cannot use the store {path}: it is not a file")
    _require_writable(path)
    if path.exists() and path.stat().st_size:  # an empty file is an empty database
        _refuse_foreign_file(path)


# The tables an Optuna RDB storage makes (its own Alembic table included): a SQLite file holding only these is
# an Optuna store, which autotune may share (optuna-dashboard then shows both). tests/storage check the list
# against the installed Optuna's models, so a new Optuna table fails a test rather than a user's start.
OPTUNA_TABLES = frozenset({
    "studies", "study_directions", "study_system_attributes", "study_user_attributes", "trial_heartbeats",
    "trial_intermediate_values", "trial_params", "trial_system_attributes", "trial_user_attributes", "trial_values",
    "trials", "version_info", "alembic_version"})
OPTUNA_VERSION_TABLE = "version_info"  # made with every Optuna RDB store


def _refuse_foreign_file(path: Path) -> None:
    """Found by the storage pass: `start --storage sqlite:///app.db` put autotune's and Optuna's tables (and
    WAL mode) into another application's database. A SQLite file that holds tables, none of them autotune's
    version table, and some neither autotune's nor Optuna's, is refused, read without writing to it. (A
    PostgreSQL database is shared by design, each application with its own tables: not refused.)"""
    from autotune._paths import one_line
    from autotune.storage.migrations import VERSION_TABLE

    tables = _sqlite_tables(path)
    # Optuna's names are Optuna's only beside its version table: a `trials` table of another application
    # made Optuna's first query fail (a traceback, "no such column: trials.trial_id")
    optuna = OPTUNA_TABLES if OPTUNA_VERSION_TABLE in tables else frozenset()
    foreign = sorted(t for t in tables - optuna if not t.startswith(("autotune_", "sqlite_")))
    if VERSION_TABLE in tables:
        return
    if not foreign:
        if optuna:
            _refuse_other_optuna_schema(path)
        return
    named = ", ".join(one_line(t)[:40] for t in foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3
                                                                else "")
    raise StorageError(f"the SQLite file {path} holds another application's tables ({named}), not an autotune or "
                       "Optuna store: give a new file for autotune's store")


def _refuse_other_optuna_schema(path: Path) -> None:
    """A file of the user's Optuna studies at another Optuna's schema: refused before autotune's tables go in
    (review: Optuna's RuntimeError came only after autotune's tables and WAL mode were in the user's file)."""
    import shlex

    from alembic.script import ScriptDirectory
    from optuna.storages import _rdb

    head = ScriptDirectory(str(Path(_rdb.__file__).parent / "alembic")).get_current_head()
    try:
        found = _sqlite_rows(path, "SELECT version_num FROM alembic_version")
    except StorageError:  # no such table (an Optuna from before its Alembic), or unreadable
        found = []
    if [row[0] for row in found] != [head]:
        at = found[0][0] if len(found) == 1 else "an unknown revision"
        raise StorageError(f"the SQLite file {path} holds Optuna studies at Optuna's schema {at}, not this Optuna's "
                           f"{head}: `optuna storage upgrade --storage {shlex.quote(f'sqlite:///{path}')}` upgrades it (or give a "
                           "new file for autotune's store)")


def _sqlite_tables(path: Path) -> set[str]:
    """The table names of a SQLite file, read without writing to it."""
    return {row[0] for row in _sqlite_rows(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}


def _sqlite_rows(path: Path, query: str) -> list[tuple]:
    """The rows of `query` on a SQLite file opened read-only: the engine's connect hook would switch it to WAL (a
    write). StorageError with SQLite's first line when the file cannot be read so."""
    import sqlite3

    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=SQLITE_BUSY_TIMEOUT_S)
        try:
            return db.execute(query).fetchall()
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:  # "file is not a database", "unable to open database file"
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise StorageError(f"cannot use the store {path}: {reason}") from None


def require_writable_sqlite(url: str) -> None:
    """For a command that writes (start, resume, import-log): an existing SQLite store file and its -wal and
    -shm companions must be writable, said in one line before anything starts (review: a read-only file got
    as far as Optuna's first INSERT, three chained tracebacks after a local Ray had started)."""
    path = sqlite_path(normalize_url(url))
    if path is not None and path.exists():  # a store that is not there: Repository.open says so, in its words
        _require_writable(path)


def _require_writable(path: Path) -> None:
    if not os.access(path.parent, os.W_OK):  # SQLite makes its -wal and -shm files there
        raise StorageError(f"cannot write the store {path}: no write permission in {path.parent}")
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if file.exists() and not os.access(file, os.W_OK):
            raise StorageError(f"cannot write the store {path}: {file.name} is read-only")


def _require_store_file(path: Path) -> None:
    """For a read-only command: the file is an autotune store, checked without writing to it. The
    engine's connect hook switches a database to WAL (a write), and SQLite turns an empty file into a
    database: a file refused as no store must be left as it was."""
    from autotune.storage.migrations import VERSION_TABLE

    nothing = f"no autotune store at {path} (nothing to read; `autotune start` creates one)"
    if path.stat().st_size == 0 or VERSION_TABLE not in _sqlite_tables(path):
        raise StorageError(nothing)


def engine_kwargs(url: str) -> dict:
    """Keyword arguments for create_engine, shared by our engine and Optuna's RDBStorage."""
    if make_url(url).get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
    return {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}}


WAL_SWITCH_TRIES = 100  # 5 s at 50 ms: the switch of a fresh file to WAL needs it alone for an instant


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    import sqlite3
    import time

    cursor = dbapi_connection.cursor()
    # readers (dashboard, --watch) never block the controller. Switching a fresh file to WAL takes an exclusive
    # lock that SQLite refuses at once, without its busy handler, to a second connection doing the same (review:
    # two starts opening one new file at once, "database is locked" in 20 of 120 opens): tried again, briefly;
    # once the other has switched the file, the pragma only reads the mode
    for attempt in range(WAL_SWITCH_TRIES):
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == WAL_SWITCH_TRIES - 1:
                raise
            time.sleep(0.05)
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def use_store_pragmas(engine: Engine) -> None:
    """Give another engine on a SQLite store (Optuna's RDBStorage) the store's own connection settings.
    Without them Optuna's connections ran with SQLite's default synchronous=FULL, an fsync of the
    write-ahead log at each of its two commits a trial, where ours need none (WAL with synchronous=NORMAL
    survives a crash of the process; a power loss can lose the last commits, of both engines alike, since
    they share one log: a consistent earlier state, which resume reconciles like any interruption)."""
    if engine.dialect.name != "sqlite":
        return
    event.listen(engine, "connect", _sqlite_pragmas)
    engine.dispose()  # a connection opened before the listener (the storage's own checks) is not reused


def _server_text(text: str) -> str:
    """A database server's message, which may quote the URL's names (a database called `\\x1b[31mX`): escapes
    shown, not obeyed, and a password it quotes hidden."""
    from autotune._paths import one_line

    return one_line(_hide_query_passwords(text))


def make_engine(url: str, create: bool = True) -> Engine:
    """An engine for `url`, checked to answer (StorageError with one clear line otherwise).

    `create=False` (read-only commands): a SQLite file that does not exist is an error, not a new store.
    """
    url = normalize_url(url)
    prepare_sqlite_file(url, create)
    try:
        engine = create_engine(url, **engine_kwargs(url))
    except (ArgumentError, ImportError, ValueError) as exc:
        raise StorageError(f"--storage '{shown_url(url)}': {exc}") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except OperationalError as exc:
        first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise StorageError(f"cannot reach storage {shown_url(engine.url)}: {_server_text(first)}") from None
    except (SQLAlchemyError, ValueError) as exc:
        # e.g. "file is not a database" (a text file given as the store), "embedded null character"
        reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0][:120]
        raise StorageError(f"storage {shown_url(engine.url)} failed: "
                           f"{exc.__class__.__name__}" + (f" ({_server_text(reason)})" if reason else "")) from None
    return engine
