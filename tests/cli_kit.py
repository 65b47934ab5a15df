"""``finality`` commands run in the test process: ``main(argv)``, its exit code and output.

A fresh ``python -m service`` costs about 2.5 CPU-s of imports before it does anything; the same
``main(argv)`` here costs only the command's own work. A test that is about the entry point or the
process itself (exit status, signals, what it loads) still starts a process. It must not hold
fixtures or assertions about a command's output.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import threading

from service.cli import main


def finality(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``main(ARGS)`` (argparse's exits included), waited for at most ``timeout`` s on a thread, as a
    ``subprocess.run`` of ``finality ARGS`` would be.

    Raises:
        TimeoutError: the command still runs after ``timeout`` s.
    """
    out, err = io.StringIO(), io.StringIO()
    ended: list[int | BaseException] = []

    def run() -> None:
        try:
            ended.append(main(list(args)))
        except SystemExit as exc:  # argparse's usage errors
            ended.append(exc.code if isinstance(exc.code, int) else 2)
        except BaseException as exc:
            ended.append(exc)

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        thread = threading.Thread(target=run, name="finality " + " ".join(args[:1]), daemon=True)
        thread.start()
        thread.join(timeout)
    if not ended:
        raise TimeoutError(f"finality {' '.join(args)} still running after {timeout} s")
    (code,) = ended
    if isinstance(code, BaseException):
        raise code
    return subprocess.CompletedProcess(["finality", *args], code, out.getvalue(), err.getvalue())
