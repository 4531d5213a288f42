"""Where a whole-step compile's time goes at 1B, and whether two compile faster side by side.

Planning time at real scale is mostly whole-step compiles (`plan.meta["compiles"]`,
`benchmarks/realscale.py`'s compiles column).  This times one model's programs (the per-layer
policies and mixes of `realscale.hand_variants`, compiled as the planner compiles them:
`MEMORY_ONLY_CPU_OPTIONS`): tracing `value_and_grad`, lowering, compiling; the CPU seconds of the
compile (the process's, so XLA's own threads count); XLA's split of the compile between its HLO
passes and code generation (its own timers, read from a child process with XLA's verbose
logging on); and two programs compiled one after the other against the same two (other, never
compiled) programs on two threads at once, and in two processes at once.

    .venv/bin/python benchmarks/compile_anatomy.py                 # llama, ~3 min on 2 cores
    .venv/bin/python benchmarks/compile_anatomy.py --model gpt
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import threading
import time

import autoremat

autoremat.configure_cpu_flags()

import jax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import provenance  # noqa: E402
from realscale import hand_variants, make_model  # noqa: E402

from autoremat.runtime._validate import MEMORY_ONLY_CPU_OPTIONS  # noqa: E402

_XLA_TIMER = re.compile(r"(Running HLO passes on|Compiling) \[jit_loss\].*? time: ([0-9.]+) (s|ms)")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _lowered(model: str, policies):
    fn, args, _, _ = make_model(model, policies)
    t0 = time.perf_counter()
    traced = jax.jit(jax.value_and_grad(fn)).trace(*args)
    t1 = time.perf_counter()
    low = traced.lower()
    return low, t1 - t0, time.perf_counter() - t1


def _mix(model: str, k: int) -> list:
    n = make_model(model)[3]
    return ["nothing_saveable"] * k + ["dots_with_no_batch_dims_saveable"] * (n - k)


def timing_rows(model: str) -> list[str]:
    rows = []
    for label, pols, _ in hand_variants(model)[1:]:
        low, t_trace, t_lower = _lowered(model, pols)
        c0, w0 = _cpu(), time.perf_counter()
        low.compile(MEMORY_ONLY_CPU_OPTIONS)
        wall, cpu = time.perf_counter() - w0, _cpu() - c0
        rows.append(f"| {label} | {t_trace:.2f} | {t_lower:.2f} | {wall:.2f} | {cpu:.2f} | {cpu / wall:.2f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def concurrency_rows(model: str) -> list[str]:
    """Two programs one after the other, then two others on two threads at once (distinct
    programs, each compiled once: a Lowered compiled twice is served from JAX's cache)."""
    lows = [_lowered(model, _mix(model, k))[0] for k in (2, 3, 4, 5)]
    t0 = time.perf_counter()
    for low in lows[:2]:
        low.compile(MEMORY_ONLY_CPU_OPTIONS)
    serial = time.perf_counter() - t0
    threads = [threading.Thread(target=low.compile, args=(MEMORY_ONLY_CPU_OPTIONS,)) for low in lows[2:]]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    both = time.perf_counter() - t0
    procs = _two_processes(model)
    return [f"| one after the other | {serial:.2f} | 1.00 |",
            f"| two threads at once | {both:.2f} | {serial / both:.2f} |",
            f"| two processes at once | {procs:.2f} | {serial / procs:.2f} |"]


def _two_processes(model: str) -> float:
    """Wall time of two child processes, each compiling one program (k = 6, 7), started together;
    each reports its compile alone (its tracing and start-up are not counted)."""
    start = time.time() + 30  # both children traced and lowered by then (about 10 s side by side)
    kids = [subprocess.Popen([sys.executable, __file__, "--model", model, "--child-compile", str(k),
                              "--start-at", str(start)], stdout=subprocess.PIPE, text=True) for k in (6, 7)]
    spans = [tuple(map(float, kid.communicate()[0].split())) for kid in kids]
    return max(end for _, end in spans) - min(start for start, _ in spans)


def _child_compile(model: str, k: int, start_at: float) -> None:
    low = _lowered(model, _mix(model, k))[0]
    time.sleep(max(0.0, start_at - time.time()))  # the two children compile from the same moment
    t0 = time.time()
    low.compile(MEMORY_ONLY_CPU_OPTIONS)
    print(t0, time.time())


def xla_split(model: str) -> tuple[float, float]:
    """(HLO passes s, code generation s) of the nothing_saveable-per-layer step, from XLA's
    own timers (a child process with TF_CPP_VMODULE set before XLA loads)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="cpu_compiler=1")
    out = subprocess.run([sys.executable, __file__, "--model", model, "--child-compile", "9"], env=env,
                         capture_output=True, text=True).stderr
    got = {}
    for kind, value, unit in _XLA_TIMER.findall(out):
        got[kind] = float(value) * (1e-3 if unit == "ms" else 1.0)
    return got.get("Running HLO passes on", float("nan")), got.get("Compiling", float("nan"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama")
    ap.add_argument("--child-compile", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.child_compile is not None:
        _child_compile(a.model, a.child_compile, a.start_at)
        return 0
    t0 = time.perf_counter()
    out = a.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                f"compile_anatomy-{a.model}.md")
    timing = timing_rows(a.model)
    passes, codegen = xla_split(a.model)
    together = concurrency_rows(a.model)
    _, _, desc, _ = make_model(a.model)
    lines = [f"# Where a whole-step compile's time goes: {a.model}", "",
             provenance(f"python benchmarks/compile_anatomy.py --model {a.model}", (time.perf_counter() - t0) / 60),
             "", desc + ".", "",
             "Each program as the planner compiles it (`MEMORY_ONLY_CPU_OPTIONS`). CPU s: the process's CPU "
             "seconds during the compile (XLA's own threads included).", "",
             "| program | trace s | lower s | compile s | CPU s | CPU / wall |", "|---|---|---|---|---|---|",
             *timing, "",
             f"XLA's own timers, a mix of 9 nothing_saveable + the rest dots_with_no_batch_dims_saveable "
             f"layers: HLO passes {passes:.2f} s, code generation {codegen:.2f} s.", "",
             "Two compiles of other, never compiled mixes (k nothing_saveable layers, k = 2 and 3 one after the "
             "other, 4 and 5 on two threads, 6 and 7 in two processes; compile alone, tracing not counted):", "",
             "| how | wall s | speed-up |", "|---|---|---|", *together, ""]
    with open(out, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
