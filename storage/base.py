"""The declarative base every table shares: one metadata with the constraint naming convention, and UTC datetimes."""

from __future__ import annotations

import datetime as dt
from typing import Any, Generic, TypeVar

from pydantic import TypeAdapter

from sqlalchemy import JSON, DateTime, MetaData
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(dt.timezone.utc) if value is not None else None

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value


M = TypeVar("M")


class ModelJSON(TypeDecorator[M], Generic[M]):
    """A JSON column read and written as a pydantic type (a model, or a list of models): validated on the way in
    and out, stored as the same plain JSON as before (unset defaults left out)."""

    impl = JSON(none_as_null=True)
    cache_ok = True

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model  # named as the argument: SQLAlchemy's statement cache key reads it
        self._adapter: TypeAdapter[Any] = TypeAdapter(model)

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if value is None:
            return None
        return self._adapter.dump_python(self._adapter.validate_python(value), mode="json", exclude_defaults=True)

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return None if value is None else self._adapter.validate_python(value)

    def coerce_compared_value(self, op: Any, value: Any) -> Any:
        return JSON()


NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dt.datetime: UTCDateTime(), dict[str, Any]: JSON, list[Any]: JSON}
