"""A fresh PostgreSQL database per test on the server at 127.0.0.1:5432 (trust auth, user
postgres), dropped afterwards; tests that need one are skipped, saying why, where none runs."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

SERVER = "postgresql://postgres@127.0.0.1:5432"


@contextmanager
def fresh_database() -> Iterator[str]:
    """The URL of a new empty database, dropped (with whatever is still connected) on exit."""
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (the 'postgres' extra)")
    try:
        admin = psycopg.connect(f"{SERVER}/postgres", autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as err:
        pytest.skip(f"no PostgreSQL server at {SERVER}: {err}")
    name = f"edgefl_test_{secrets.token_hex(6)}"
    with admin:
        admin.execute(f"CREATE DATABASE {name}")
        try:
            yield f"{SERVER}/{name}"
        finally:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
