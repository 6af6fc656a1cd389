"""Everything a test's store wrote on the servers, read behind its back (SPEC §9 tests)."""

from __future__ import annotations

import session_stores


def postgres_bytes() -> bytes:
    """Every value of every row of every table of this test's schema (``SELECT *``)."""
    import psycopg

    from postgres_server import DSN

    (schema,) = session_stores.PG_SCHEMAS
    out: list[bytes] = []
    with psycopg.connect(DSN, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        ).fetchall()
        assert tables
        for (table,) in tables:
            for row in conn.execute(f'SELECT * FROM "{schema}"."{table}"'):
                for value in row:
                    out.append(bytes(value) if isinstance(value, bytes | memoryview) else
                               str(value).encode())  # fmt: skip
    return b"\n".join(out)


def redis_bytes() -> bytes:
    """Every key under this test's prefix and every value it holds (``SCAN``)."""
    from redis_server import client

    (prefix,) = session_stores.REDIS_PREFIXES
    out: list[bytes] = []
    with client() as c:
        keys = list(c.scan_iter(match=prefix + "*", count=1000))
        assert keys
        for key in keys:
            kind = c.type(key).decode()
            out.append(key)
            if kind == "string":
                out.append(c.get(key))
            elif kind == "hash":
                for field, value in c.hgetall(key).items():
                    out.extend((field, value))
            elif kind == "list":
                out.extend(c.lrange(key, 0, -1))
            elif kind == "set":
                out.extend(c.smembers(key))
            elif kind == "zset":
                out.extend(member for member, _ in c.zrange(key, 0, -1, withscores=True))
            elif kind == "stream":
                for _, fields in c.xrange(key):
                    for field, value in fields.items():
                        out.extend((field, value))
            else:
                raise AssertionError(f"key {key!r} of type {kind} is not read by this test")
    return b"\n".join(out)
