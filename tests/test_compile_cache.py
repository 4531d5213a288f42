"""The planner's compile cache (autoremat/_compile_cache.py): a later process reads what
XLA said about each program instead of compiling it again, and plans alike."""

import json
import subprocess
import sys
import warnings

import pytest

from autoremat import _compile_cache

VALUE = {"peak_bytes": 10, "argument_bytes": 4, "output_bytes": 3, "temp_bytes": 5, "alias_bytes": 2,
          "host_bytes": 0, "xla_peak_bytes": None, "flops": 1.5e9, "backend": "cpu", "compile_time": 0.25}


def test_an_entry_is_read_back_for_its_program_and_options_only(tmp_path, monkeypatch):
    monkeypatch.setenv(_compile_cache.CACHE_ENV, str(tmp_path))
    opts = {"xla_backend_optimization_level": 0}
    _compile_cache.store("stats", "program-a", VALUE, opts)
    assert _compile_cache.load("stats", "program-a", opts) == VALUE
    assert _compile_cache.load("stats", "program-b", opts) is None
    assert _compile_cache.load("divisors", "program-a", opts) is None  # another kind of answer
    assert _compile_cache.load("stats", "program-a") is None  # compiled with other options
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")  # another XLA
    assert _compile_cache.load("stats", "program-a", opts) is None
    assert not list(tmp_path.rglob("*.tmp"))  # written atomically


def test_an_unreadable_entry_is_compiled_again(tmp_path, monkeypatch):
    monkeypatch.setenv(_compile_cache.CACHE_ENV, str(tmp_path))
    _compile_cache.store("stats", "program-a", VALUE)
    (entry,) = tmp_path.rglob("*.json")
    entry.write_text(entry.read_text()[:20])
    assert _compile_cache.load("stats", "program-a") is None
    entry.write_text(json.dumps({"format": _compile_cache.FORMAT + 1, "kind": "stats", "value": VALUE}))
    assert _compile_cache.load("stats", "program-a") is None


@pytest.mark.parametrize("setting", ["off", "", "0"])
def test_the_cache_can_be_turned_off(tmp_path, monkeypatch, setting):
    monkeypatch.setenv(_compile_cache.CACHE_ENV, setting)
    assert _compile_cache.cache_dir() is None
    _compile_cache.store("stats", "program-a", VALUE)
    assert _compile_cache.load("stats", "program-a") is None


def test_the_default_place_follows_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv(_compile_cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _compile_cache.cache_dir() == tmp_path / "autoremat" / "compiled"


def test_a_directory_that_cannot_be_written_is_warned_about_once(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(_compile_cache.CACHE_ENV, str(blocker / "cache"))  # under a file: mkdir fails
    monkeypatch.setattr(_compile_cache, "_WARNED", [])
    with pytest.warns(UserWarning, match="could not write its compile cache"):
        _compile_cache.store("stats", "program-a", VALUE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compile_cache.store("stats", "program-b", VALUE)


PLAN_TWICE = """
import json, autoremat
autoremat.configure_cpu_flags()
from autoremat import examples
ex = examples.get_example("mlp_chain", n_layers=4, width=64, batch=64)
plan = autoremat.optimize(ex.fn, budget=0.7).plan(*ex.args)  # two compiles: 0.8 takes one
print(json.dumps({k: plan.meta.get(k) for k in ("found_by", "compiled_peak", "compiles", "cached_compiles",
                                                  "extra_flops")}))
"""


def test_a_second_process_reads_every_compile_and_plans_alike(tmp_path):
    """Two processes plan the same step at the same budget: the second compiles nothing (every
    whole-step compile the first made is read back) and returns the same plan."""
    env = {**_environment(), _compile_cache.CACHE_ENV: str(tmp_path)}
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", PLAN_TWICE], capture_output=True, text=True, env=env,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["compiles"] >= 2 and first["cached_compiles"] == 0
    assert second["cached_compiles"] == second["compiles"] == first["compiles"]
    assert {k: v for k, v in second.items() if k != "cached_compiles"} == {
        k: v for k, v in first.items() if k != "cached_compiles"}


def _environment() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != _compile_cache.CACHE_ENV}


def test_a_later_process_reads_how_xla_splits_a_sharded_steps_values(tmp_path, monkeypatch):
    """The sharded graph's one compile (`propagated_divisors`: 8 of the sharded 1B's 9 s of graph
    building) is read back by a later process.  x split 2 ways by rows and w 2 ways by columns:
    XLA splits x @ w 4 ways, where the fallback rule without that compile says 2; the second
    build gets 4 with XLA's compile made to fail."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    from autoremat.graph import _shardings, build_graph

    monkeypatch.setenv(_compile_cache.CACHE_ENV, str(tmp_path))
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    x = jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=NamedSharding(mesh, P("data", None)))
    w = jax.ShapeDtypeStruct((32, 16), jnp.float32, sharding=NamedSharding(mesh, P(None, "model")))

    def tanh_bytes():
        g = build_graph(lambda w, x: jnp.mean(jnp.tanh(x @ w)), w, x)
        return next(g.values[op.outputs[0]].nbytes for op in g.ops.values() if op.primitive == "tanh")

    assert tanh_bytes() == 64 * 16 * 4 // 4
    monkeypatch.setattr(_shardings, "_CACHE", {})  # as in a new process

    def refuse(self, *a, **k):
        raise RuntimeError("compiled although the cache holds this program")

    monkeypatch.setattr(jax.stages.Lowered, "compile", refuse)
    assert tanh_bytes() == 64 * 16 * 4 // 4
    monkeypatch.setenv(_compile_cache.CACHE_ENV, "off")  # the same with nothing kept: the rule's 2 pieces
    monkeypatch.setattr(_shardings, "_CACHE", {})
    assert tanh_bytes() == 64 * 16 * 4 // 2
