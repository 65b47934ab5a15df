"""What tests on a PostgreSQL ledger ask the cluster itself, beside the ledger's own interface.

For tests only: it reads ``pg_stat_activity`` over a connection of its own and changes nothing.
"""

from __future__ import annotations

from engine.ledger import pg_client


def analyst_backends(pg_url: str) -> list[int]:
    """Pids of the backends running an analyst query now (it runs in the FETCH of its server-side cursor)."""
    with pg_client.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE state = 'active' "
            "AND query LIKE '%finality_analyst_query%' AND pid <> pg_backend_pid()"
        ).fetchall()
    return [int(r[0]) for r in rows]
