"""Finality reference task servers: real HTTP servers for MCP 2025-11-25 tasks, the MCP 2026-07-28
tasks extension and Google AIP-151 operations, with deliberate fault injection for adapter tests.

Run one with ``python -m refserver --protocol ... --port 0``; drive one from a test with
``refserver.testing.RefServer``. Not for production traffic: state lives in memory and the admin API
is unauthenticated.
"""

from refserver.testing import RefServer

__all__ = ["RefServer"]
