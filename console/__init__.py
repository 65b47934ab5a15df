"""The console's data layer: the insights facade, its named SQL, its sources (service, file, PostgreSQL), view types and exports.

No Streamlit here: pages render what these modules return. Nothing here writes a ledger.
"""

__all__ = []
