"""`autotune db upgrade` and `autotune db current`: autotune's schema migrations."""

from __future__ import annotations

import argparse
import json


def register(sub) -> None:
    p = sub.add_parser("db", help="database schema: current revision, upgrade")
    db = p.add_subparsers(dest="db_command", metavar="{current,upgrade}", parser_class=type(p), required=True)
    for name, handler, text in (("current", cmd_current, "show the schema revision of the database"),
                                ("upgrade", cmd_upgrade, "migrate the database to this autotune's schema")):
        q = db.add_parser(name, help=text)
        q.add_argument("--storage", help="database URL (default: $AUTOTUNE_STORAGE if not empty, else the user's SQLite file)")
        q.add_argument("--json", action="store_true", help="print the revisions as JSON")
        q.set_defaults(handler=handler)


def _engine(args: argparse.Namespace):
    from autotune.cli._study_cmds import open_store
    from autotune.storage import make_engine

    # both act on a store that exists: `current` reads it, `upgrade` migrates it (`start` creates one); a
    # typo must not leave a new empty store, or its folders, behind. An empty --storage is an error, not
    # the default store.
    return open_store(args, lambda url: make_engine(url, create=False))


def cmd_current(args: argparse.Namespace) -> int:
    from autotune.storage import current_revision, head_revision
    from autotune.storage.migrations import is_newer, refuse_unversioned_tables

    engine = _engine(args)
    current, head = current_revision(engine), head_revision(engine)
    if current is None:
        refuse_unversioned_tables(engine)
    info = {"current": current, "head": head, "up_to_date": current == head}
    if args.json:
        print(json.dumps(info))
    elif current is None:  # a server database autotune never wrote to: say so, not "(none)"
        print(f"no autotune schema in this database; `autotune start` (or `autotune db upgrade`) creates it at {head}")
    else:
        advice = ("" if current == head else " (written by a newer autotune: upgrade autotune to use it)"
                  if is_newer(engine, current) else " (run `autotune db upgrade`)")
        print(f"schema revision {current}; this autotune writes {head}{advice}")
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    from alembic.util.exc import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    from autotune.errors import StorageError
    from autotune.storage import current_revision, head_revision
    from autotune.storage.migrations import upgrade_from

    engine = _engine(args)
    before = current_revision(engine)  # for the messages below; upgrade_from reads it again under the lock
    try:
        before, after = upgrade_from(engine)
    except CommandError as exc:
        raise StorageError(f"cannot upgrade from revision {before}: {exc} (is it from a newer autotune?)") from None
    except SQLAlchemyError as exc:  # a table in the way, a permission: one line, the migration rolled back
        first = str(exc.orig if getattr(exc, "orig", None) is not None else exc).strip().splitlines()[0][:200]
        raise StorageError(f"cannot upgrade from revision {before or '(none)'}: {first}") from None
    print(json.dumps({"from": before, "to": after}) if args.json else
          f"schema created at {after}" if before is None else
          f"schema upgraded from {before} to {after}" if before != after else
          f"schema already at {after} (head {head_revision(engine)})")
    return 0
