"""Alembic environment for autotune's own tables (run programmatically by autotune.storage.migrations)."""

from __future__ import annotations

from alembic import context

from autotune.storage.models import Base

VERSION_TABLE = "autotune_alembic_version"


def include_object(obj, name, type_, reflected, compare_to):
    # Optuna's tables share the database: autogenerate must neither drop nor alter them.
    if type_ == "table":
        return name.startswith("autotune_")
    return True


def run_migrations_online() -> None:
    connection = context.config.attributes["connection"]
    context.configure(connection=connection, target_metadata=Base.metadata, version_table=VERSION_TABLE,
                      include_object=include_object, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
