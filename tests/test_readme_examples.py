"""The README's walkthrough (examples/train_flax.py) runs and its optimized step fits."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_flax_training_walkthrough_runs(capsys):
    spec = importlib.util.spec_from_file_location("train_flax", ROOT / "examples" / "train_flax.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    out = capsys.readouterr().out
    assert "step 2: loss" in out
    assert "-> fits" in out


def test_readme_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    commands = [ln for ln in lines[:8] if ln.startswith(".venv/") or ln.startswith("python3 -m venv")]
    assert commands[0].endswith("autoremat demo")
    assert commands[1] == ".venv/bin/python -m pytest -q"
    assert commands[1] in (ROOT / ".ci" / "run").read_text()
