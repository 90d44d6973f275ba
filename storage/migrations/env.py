"""Alembic environment: runs migrations on the engine handed over by storage.migrate."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from storage.db import make_engine
from storage.models import Base, compared_by_alembic

config = context.config
target_metadata = Base.metadata


def run_migrations() -> None:
    engine = config.attributes.get("engine")
    if engine is None:
        url = config.get_main_option("sqlalchemy.url")
        if url is None:
            raise RuntimeError("alembic was given neither an engine nor sqlalchemy.url")
        engine = make_engine(url)
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Processes starting together (a worker, the bot) migrate one at a time.
            connection.execute(text("SELECT pg_advisory_xact_lock(7247318)"))
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
            include_object=compared_by_alembic,
        )
        context.run_migrations()


run_migrations()
