"""What XLA said about each program the planner compiled, kept on disk across processes.

Planning compiles whole training steps only to read their memory (at 1B parameters 4-9 s each
on a 2-core CPU, 20-43 s on an H100: docs/FINDINGS.md), and a training script that restarts, or
plans again at another budget, compiles the same programs again.  This cache keys each compile
by a digest of the lowered program (`StagedStep.program_key`: the StableHLO text, shardings
included) and of everything else that decides what XLA makes of it (jax and jaxlib versions,
backend and its version, device kind and count, XLA_FLAGS, the compile options), and keeps the
answer: the memory and FLOPs of a step (`runtime.compile_step(..., cache=True)`; its own
jaxpr's FLOPs are counted afresh) and how XLA splits a sharded step's values
(`graph._shardings.propagated_divisors`).  A program seen before is not compiled again.  Only
the planner's compiles go through it: `validate` and timed runs always compile.

Where: `AUTOREMAT_CACHE_DIR`, else `$XDG_CACHE_HOME/autoremat/compiled` (default
`~/.cache/autoremat/compiled`); `AUTOREMAT_CACHE_DIR=off` turns it off, as the test suite and
the benchmarks do (their planning times are cold).  Each entry is a small JSON file written
atomically, so processes planning side by side (several hosts, one file system) can share it;
an entry that cannot be read is compiled again, and a directory that cannot be written is
warned about once and left alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

import jax

__all__ = ["CACHE_ENV", "cache_dir", "load", "program_key", "store"]

CACHE_ENV = "AUTOREMAT_CACHE_DIR"
_OFF = ("", "0", "off", "none", "false")
# Bumped whenever what an entry holds, or how the key is made, changes.
FORMAT = 1
_WARNED: list = []


def cache_dir() -> Path | None:
    """The directory entries go in, or None where the cache is off (`AUTOREMAT_CACHE_DIR`)."""
    where = os.environ.get(CACHE_ENV)
    if where is not None:
        return None if where.strip().lower() in _OFF else Path(where).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "autoremat" / "compiled"


def program_key(lowered) -> str:
    """The digest a lowered program (`jax.stages.Lowered`) is known by: of its StableHLO text,
    shardings and partition counts included.  Programs with equal keys compile alike."""
    return hashlib.sha256(lowered.as_text().encode()).hexdigest()


def _environment(options) -> list:
    """Everything besides the program text that decides what XLA compiles it to."""
    import jaxlib

    backend = jax.extend.backend.get_backend()
    devices = jax.devices()
    return [FORMAT, jax.__version__, jaxlib.__version__, backend.platform, backend.platform_version,
            sorted({d.device_kind for d in devices}), len(devices), os.environ.get("XLA_FLAGS", ""),
            os.environ.get("LIBTPU_INIT_ARGS", ""), sorted((options or {}).items())]


def _path(root: Path, kind: str, program_key: str, options) -> Path:
    digest = hashlib.sha256(json.dumps([kind, program_key, _environment(options)], default=str).encode()).hexdigest()
    return root / digest[:2] / f"{digest}.json"


def load(kind: str, program_key: str, options=None):
    """The value kept for this kind of answer, program (`StagedStep.program_key`) and compile
    options; None where the cache is off or holds no readable entry for it."""
    root = cache_dir()
    if root is None:
        return None
    try:
        entry = json.loads(_path(root, kind, program_key, options).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("kind") != kind:
        return None
    return entry.get("value")


def store(kind: str, program_key: str, value, options=None) -> None:
    """Keep `value` (JSON: numbers, strings, lists, dicts) for this kind, program and options."""
    root = cache_dir()
    if root is None:
        return
    path, tmp = _path(root, kind, program_key, options), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "kind": kind, "value": value}, f)
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if not _WARNED:
            _WARNED.append(root)
            warnings.warn(f"autoremat could not write its compile cache in {root} ({e.strerror or e}); planning "
                          f"goes on without it: set {CACHE_ENV} to a writable directory, or to 'off'", stacklevel=3)
