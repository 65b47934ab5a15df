"""Finality console: sets the page config, builds one ``Insights`` per configuration, and runs the chosen page.

Presentation only. Every page reads through ``console.insights`` (the running service over HTTP, or
a ledger file or PostgreSQL ledger read-only when no service runs: ``FINALITY_SERVICE_URL`` /
``FINALITY_LEDGER``).
Each page's URL is its file's name (``/rollout_control``), and any page can be opened first.

    streamlit run app.py

Why pages call ``console_insights()``: Streamlit treats an app with a ``pages/`` folder as a
"pages directory" app until some session has called ``st.navigation``. Until then, a page URL opened
first runs that page's file alone, without this script (no ``Insights``, no sidebar). A page that
finds this script did not run in the current run runs it (its ``st.navigation`` ends that mode for the
server and draws the page as usual, widget events included) and stops its own copy.
"""

from __future__ import annotations

from console.frame import main

if __name__ == "__main__":
    main()
