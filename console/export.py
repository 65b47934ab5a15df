"""The console's exports: a frame as CSV or Parquet bytes, and the JSON encoding the evidence bundle uses.

No Streamlit and no ledger access: values in, bytes out.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timedelta

import pandas as pd  # type: ignore[import-untyped]


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, default=_json_default, indent=2, sort_keys=True).encode()


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


def _csv_bytes(frame: pd.DataFrame) -> bytes:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, quoting=csv.QUOTE_MINIMAL)
    return buffer.getvalue().encode()


def frame_to_parquet(frame: pd.DataFrame) -> bytes:
    """A result as Parquet bytes (for downloads)."""
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def frame_to_csv(frame: pd.DataFrame) -> bytes:
    return _csv_bytes(frame)


__all__ = [
    "frame_to_csv",
    "frame_to_parquet",
]
