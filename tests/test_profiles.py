"""Tests for device profiles (autoremat/graph/_profiles.py)."""

import dataclasses
import types

import numpy as np
import pytest

import autoremat.graph._profiles as profiles_mod
from autoremat._errors import AutorematError
from autoremat.graph._costs import OpCost
from autoremat.graph._profiles import (
    DeviceProfile,
    detect_profile,
    get_profile,
    list_profiles,
    register_profile,
)


def toy(name="toy-device", **overrides):
    fields = dict(
        name=name,
        peak_flops={"default": 1e12, "bfloat16": 4e12},
        memory_bandwidth=1e11,
        host_bandwidth=1e10,
        memory_bytes=2**30,
        transcendental_rate=1e10,
        description="test",
    )
    fields.update(overrides)
    return DeviceProfile(**fields)


@pytest.fixture
def registry_guard():
    """Restore the profile registry after a test that registers profiles."""
    saved = dict(profiles_mod._REGISTRY)
    yield
    profiles_mod._REGISTRY.clear()
    profiles_mod._REGISTRY.update(saved)


def test_builtins_present():
    assert {"h100", "h200", "a100", "tpu-v5e", "tpu-v4", "cpu"} <= set(list_profiles())
    assert list(list_profiles()) == sorted(list_profiles())


@pytest.mark.parametrize("name", ["h100", "h200", "gh200", "a100", "tpu-v5e", "tpu-v4", "cpu"])
def test_builtin_profiles_are_sane(name):
    p = get_profile(name)
    assert p.name == name
    assert {"default", "float32", "bfloat16"} <= set(p.peak_flops)
    assert p.memory_bytes > 0 and p.description
    assert p.host_bandwidth <= p.memory_bandwidth


def test_spec_numbers():
    h100, h200, a100, v5e = (get_profile(n) for n in ("h100", "h200", "a100", "tpu-v5e"))
    assert h100.peak_flops["bfloat16"] == 989e12
    assert h100.peak_flops["float32"] == 67e12
    assert h100.memory_bandwidth == 3.35e12 and h100.memory_bytes == 80 * 2**30
    assert h200.peak_flops == h100.peak_flops and h200.memory_bandwidth == 4.8e12
    assert h200.memory_bytes == 141 * 10**9
    assert a100.peak_flops["bfloat16"] == 312e12 and a100.peak_flops["float32"] == 19.5e12
    assert v5e.peak_flops["bfloat16"] == 197e12 and v5e.memory_bandwidth == 819e9
    assert v5e.memory_bytes == 16 * 2**30


def test_profile_is_frozen_and_hashable():
    p = toy()
    q = toy()
    assert p == q and hash(p) == hash(q) and len({p, q}) == 1
    assert p != toy(memory_bandwidth=2e11)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.memory_bandwidth = 1.0
    assert isinstance(p.peak_flops, types.MappingProxyType)
    with pytest.raises(TypeError):
        p.peak_flops["default"] = 1.0
    assert hash(get_profile("h100")) == hash(dataclasses.replace(get_profile("h100")))


def test_profile_validation():
    with pytest.raises(AutorematError, match=r"peak_flops needs a 'default' key, got keys \['float32'\]"):
        toy(peak_flops={"float32": 1e12})
    with pytest.raises(AutorematError, match="memory_bandwidth must be > 0, got 0.0"):
        toy(memory_bandwidth=0)
    with pytest.raises(AutorematError, match=r"peak_flops\['default'\] must be > 0"):
        toy(peak_flops={"default": -1})


def test_op_time_roofline():
    p = toy()
    # compute-bound: 1e12 flops at 1e12 FLOP/s
    assert p.op_time(OpCost(flops=1e12, bytes_read=1e9)) == pytest.approx(1.0)
    # memory-bound: 2e11 bytes at 1e11 B/s
    assert p.op_time(OpCost(flops=1e9, bytes_read=1.5e11, bytes_written=0.5e11)) == pytest.approx(2.0)
    # transcendental-bound: 3e10 at 1e10/s
    assert p.op_time(OpCost(transcendentals=3e10)) == pytest.approx(3.0)
    assert p.op_time(OpCost()) == 0.0


def test_op_time_dtype_lookup():
    p = toy()
    cost = OpCost(flops=4e12)
    assert p.op_time(cost, "bfloat16") == pytest.approx(1.0)
    assert p.op_time(cost, "float32") == pytest.approx(4.0)  # falls back to 'default'
    assert p.op_time(cost, "key<fry>") == pytest.approx(4.0)
    assert p.op_time(cost, np.dtype("float32")) == pytest.approx(4.0)
    import jax.numpy as jnp

    assert p.op_time(cost, jnp.bfloat16) == pytest.approx(1.0)


def test_transfer_time():
    assert toy().transfer_time(5e10) == pytest.approx(5.0)
    assert get_profile("h100").transfer_time(55e9) == pytest.approx(1.0)


def test_h100_faster_than_a100_and_h200_more_bandwidth():
    matmul = OpCost(flops=2 * 8192**3, bytes_read=2 * 2 * 8192**2, bytes_written=2 * 8192**2)
    copy = OpCost(bytes_read=1e9, bytes_written=1e9)
    h100, a100 = get_profile("h100"), get_profile("a100")
    assert h100.op_time(matmul, "bfloat16") < a100.op_time(matmul, "bfloat16")
    assert get_profile("h200").op_time(copy) < get_profile("h100").op_time(copy)


def test_register_and_get(registry_guard):
    p = toy("autoremat-test-dev")
    assert register_profile(p) is p
    assert get_profile("autoremat-test-dev") is p
    assert "autoremat-test-dev" in list_profiles()
    with pytest.raises(AutorematError, match="'autoremat-test-dev' is already registered; pass overwrite=True"):
        register_profile(toy("autoremat-test-dev", memory_bandwidth=5e11))
    q = toy("autoremat-test-dev", memory_bandwidth=5e11)
    register_profile(q, overwrite=True)
    assert get_profile("autoremat-test-dev") is q


def test_register_builtin_name_needs_overwrite(registry_guard):
    with pytest.raises(AutorematError, match="'h100' is already registered"):
        register_profile(toy("h100"))


def test_get_profile_errors():
    p = toy()
    assert get_profile(p) is p
    with pytest.raises(AutorematError, match=r"unknown device profile 'b200'; known profiles: .*h100"):
        get_profile("b200")
    with pytest.raises(TypeError, match="got int"):
        get_profile(3)
    with pytest.raises(TypeError, match="expects a DeviceProfile, got str"):
        register_profile("h100")


def test_detect_profile_here_is_cpu():
    assert detect_profile().name == "cpu"


@pytest.mark.parametrize(
    "platform,kind,expected",
    [
        ("gpu", "NVIDIA H100 80GB HBM3", "h100"),
        ("gpu", "NVIDIA H100 PCIe", "h100"),
        ("gpu", "NVIDIA H200", "h200"),
        ("gpu", "NVIDIA GH200 480GB", "gh200"),
        ("gpu", "NVIDIA A100-SXM4-80GB", "a100"),
        ("tpu", "TPU v5 lite", "tpu-v5e"),
        ("tpu", "TPU v5e", "tpu-v5e"),
        ("tpu", "TPU v4", "tpu-v4"),
        ("cpu", "cpu", "cpu"),
    ],
)
def test_detect_profile_by_device_kind(platform, kind, expected):
    device = types.SimpleNamespace(platform=platform, device_kind=kind)
    assert detect_profile(device).name == expected


def test_detect_profile_unknown_gpu_warns():
    device = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA GeForce RTX 4090")
    with pytest.warns(UserWarning, match=r"device kind 'NVIDIA GeForce RTX 4090'; using 'h100'"):
        assert detect_profile(device).name == "h100"
