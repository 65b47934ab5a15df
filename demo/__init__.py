"""The living demo (``make demo``) and the seeding of large ledgers for the console and benchmarks.

Composes the engine, the service and the reference servers; nothing in ``engine`` imports it.
"""

__all__ = []
