"""``perdure rotate-keys`` in a process that SIGKILLs itself at its N-th write step.

Run as ``python rotate_keys_child.py N ARGS...`` (ARGS as for ``perdure``). The write
steps are the file store's renames and fsyncs (journal rewrites, head files,
checkpoint files) and the SQLite store's write transactions (before and after each),
so kills land inside a session's rewrite as well as between two of them.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any


def main() -> int:
    limit = int(sys.argv[1])
    steps = 0

    def step() -> None:
        nonlocal steps
        steps += 1
        if steps >= limit:
            os.kill(os.getpid(), signal.SIGKILL)

    real_replace, real_fsync = os.replace, os.fsync

    def replace(a: Any, b: Any) -> None:
        step()
        real_replace(a, b)
        step()

    def fsync(fd: int) -> None:
        step()
        real_fsync(fd)

    os.replace = replace  # type: ignore[assignment]
    os.fsync = fsync

    from perdure.stores.sqlite import SQLiteSessionStore

    for name in ("_write_messages", "_checkpoint_put"):
        real = getattr(SQLiteSessionStore, name)

        def around(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            step()
            result = _real(*args, **kwargs)
            step()
            return result

        setattr(SQLiteSessionStore, name, around)

    from perdure.cli.main import main as cli_main

    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
