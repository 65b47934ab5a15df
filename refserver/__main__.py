"""``python -m refserver``: see ``refserver.cli``."""

from refserver.cli import main

raise SystemExit(main())
