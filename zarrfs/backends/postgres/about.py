"""The PostgreSQL driver's declaration (``postgresql://``, ``postgres://``): :data:`ABOUT`.
Its password comes from the URL, ``?password_file=`` (read by the driver) or libpq's own
``PGPASSWORD`` and ``~/.pgpass``."""

from __future__ import annotations

from ..about import About

#: libpq's connection parameters a URL hands on.
LIBPQ_OPTIONS = (
    "sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout", "application_name", "host",
)

ABOUT = About(
    driver="zarrfs.backends.postgres.driver:PostgresDriver",
    schemes=("postgresql", "postgres"),
    kind="a PostgreSQL database",
    options=("table", "password_file", *LIBPQ_OPTIONS),
    pip={"psycopg": "psycopg[binary]"},
)
