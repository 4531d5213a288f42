"""`autoremat._progress`: a live line during long steps on a terminal, nothing extra elsewhere."""

import io
import time

from autoremat._progress import Progress, working


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_long_step_shows_a_ticking_line_on_a_terminal():
    lines, tty = [], _Terminal()
    progress = Progress(lines.append, file=tty)
    with working(progress, "compiling nothing_saveable per layer"):
        time.sleep(1.2)
    progress("chosen")
    shown = tty.getvalue()
    assert "[autoremat] compiling nothing_saveable per layer 00:01" in shown  # the elapsed time ticked
    assert lines == ["chosen"]  # finished steps stay ordinary lines


def test_quiet_when_not_a_terminal_or_not_a_progress():
    lines, pipe = [], io.StringIO()
    with working(Progress(lines.append, file=pipe), "compiling"):
        pass
    assert pipe.getvalue() == "" and lines == []
    with working(lines.append, "compiling"):  # a plain callable has no live line
        pass
