"""The README's walkthroughs (examples/train_flax.py, examples/train_sharded.py) run and their
optimized steps fit."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_flax_training_walkthrough_runs(capsys):
    spec = importlib.util.spec_from_file_location("train_flax", ROOT / "examples" / "train_flax.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    out = capsys.readouterr().out
    assert "step 2: loss" in out
    assert "-> fits" in out


def test_sharded_training_walkthrough_runs():
    """FSDP x TP over 8 host devices with `optimize` inside `jit`: its own process, since the
    device count is fixed when JAX starts.  Gradients equal the un-optimized sharded step's:
    recomputation repeats the same operations on the same shards (and the data-parallel
    test in test_training_code.py measures them bit-identical; this one measured 0 too)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "train_sharded.py")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 2: loss" in proc.stdout and "-> fits" in proc.stdout, proc.stdout
    err = float(re.search(r"largest gradient difference from the un-optimized step: (\S+)", proc.stdout)[1])
    assert err <= 1e-6, proc.stdout


def test_readme_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    commands = [ln for ln in lines[:8] if ln.startswith(".venv/") or ln.startswith("python3 -m venv")]
    assert commands[0].endswith("autoremat demo")
    assert commands[1] == ".venv/bin/python -m pytest -q"
    assert commands[1] in (ROOT / ".ci" / "run").read_text()
