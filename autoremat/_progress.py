"""Progress on stderr: one line per finished step, and a live line while a long step runs.

`Progress(say)` is what the CLI and `optimize(..., verbose=True)` hand the planner as its
`say`: calling it prints a line; `progress.working("compiling X")` is a context manager that,
when stderr is a terminal, shows `[autoremat] compiling X 0:12` ticking (tqdm) until the step
ends, then clears it.  Not a terminal (CI logs, pipes, tests): only the lines.  A compile at
1B parameters takes 12-15 s on this 2-core CPU (benchmarks/results/sharded.md), long enough
to look hung without it.
"""

from __future__ import annotations

import contextlib
import sys
import threading

from tqdm import tqdm

__all__ = ["Progress", "working"]


class Progress:
    """A `say(msg)` callable with a live `working(what)` context (see the module docstring)."""

    def __init__(self, say, file=None):
        self._say = say
        self._file = file

    def __call__(self, msg: str) -> None:
        self._say(msg)

    @contextlib.contextmanager
    def working(self, what: str):
        file = self._file or sys.stderr
        bar = tqdm(desc=f"[autoremat] {what}", total=None, bar_format="{desc} {elapsed}", file=file,
                   disable=None, leave=False)
        if bar.disable:
            yield
            return
        done = threading.Event()

        def tick():
            while not done.wait(0.5):
                bar.refresh()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()
            bar.close()


def working(say, what: str):
    """`say.working(what)` when `say` is a `Progress`, else nothing."""
    live = getattr(say, "working", None)
    return live(what) if live is not None else contextlib.nullcontext()
