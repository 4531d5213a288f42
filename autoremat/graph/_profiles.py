"""Device profiles: the numbers a roofline time estimate needs, as plain data.

A :class:`DeviceProfile` holds peak FLOP rates per dtype, HBM bandwidth, host-link
bandwidth (for offload), device memory and a transcendental rate. ``op_time`` is the
roofline time of an :class:`~autoremat.graph._costs.OpCost`: the slowest of compute,
memory traffic and transcendental throughput, assuming the other two overlap fully.

Built-in numbers are vendor spec-sheet peaks (dense, no structured sparsity); each
profile cites its source and marks what is an assumption. Real kernels reach a fraction
of these peaks; the solver only compares plans on one profile, so a common factor cancels.
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from autoremat._errors import AutorematError
from autoremat.graph._costs import OpCost

__all__ = [
    "DeviceProfile",
    "register_profile",
    "get_profile",
    "list_profiles",
    "detect_profile",
]

GiB = 1024**3
GB = 10**9


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """Peak rates of one device, for roofline time estimates.

    Attributes:
      name: registry name, e.g. ``"h100"``.
      peak_flops: FLOP/s by dtype name (``"float32"``, ``"bfloat16"``, ``"float16"``,
        ``"float64"``, ``"int8"``, ...) with a ``"default"`` key used for any other dtype.
        Stored read-only.
      memory_bandwidth: device-memory (HBM) bandwidth in bytes/s.
      host_bandwidth: device <-> pinned-host bandwidth in bytes/s, one direction.
      memory_bytes: device memory in bytes.
      transcendental_rate: transcendental evaluations per second (exp, tanh, ...).
      description: where the numbers come from.

    >>> p = DeviceProfile("toy", {"default": 1e12}, memory_bandwidth=1e11,
    ...                   host_bandwidth=1e10, memory_bytes=2**30, transcendental_rate=1e10)
    >>> p.op_time(OpCost(flops=1e12, bytes_read=1e10))   # compute-bound: 1 s vs 0.1 s
    1.0
    """

    name: str
    peak_flops: Mapping[str, float]
    memory_bandwidth: float
    host_bandwidth: float
    memory_bytes: int
    transcendental_rate: float
    description: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise AutorematError(f"a device profile needs a non-empty str name, got {self.name!r}")
        flops = {str(k): float(v) for k, v in dict(self.peak_flops).items()}
        if "default" not in flops:
            raise AutorematError(
                f"profile {self.name!r}: peak_flops needs a 'default' key, got keys {sorted(flops)}"
            )
        for key, rate in flops.items():
            if not rate > 0:
                raise AutorematError(f"profile {self.name!r}: peak_flops[{key!r}] must be > 0, got {rate}")
        object.__setattr__(self, "peak_flops", types.MappingProxyType(flops))
        for field in ("memory_bandwidth", "host_bandwidth", "transcendental_rate"):
            value = float(getattr(self, field))
            if not value > 0:
                raise AutorematError(f"profile {self.name!r}: {field} must be > 0, got {value}")
            object.__setattr__(self, field, value)
        object.__setattr__(self, "memory_bytes", int(self.memory_bytes))

    def __hash__(self) -> int:
        return hash(
            (
                self.name,
                tuple(sorted(self.peak_flops.items())),
                self.memory_bandwidth,
                self.host_bandwidth,
                self.memory_bytes,
                self.transcendental_rate,
                self.description,
            )
        )

    def flops_rate(self, dtype: Any = "float32") -> float:
        """Peak FLOP/s for ``dtype`` (a name or numpy dtype), else the ``"default"`` rate.

        >>> get_profile("h100").flops_rate("bfloat16")
        989000000000000.0
        """
        key = dtype if isinstance(dtype, str) else _dtype_name(dtype)
        return self.peak_flops.get(key, self.peak_flops["default"])

    def op_time(self, cost: OpCost, dtype: Any = "float32") -> float:
        """Roofline time in seconds of ``cost`` with arithmetic in ``dtype``.

        ``max(flops / peak_flops[dtype], (bytes_read + bytes_written) / memory_bandwidth,
        transcendentals / transcendental_rate)``; an unknown dtype uses ``"default"``.

        >>> h100 = get_profile("h100")
        >>> t = h100.op_time(OpCost(flops=2 * 4096**3), "bfloat16")   # a 4096^3 matmul
        >>> round(t * 1e6)   # microseconds
        139
        """
        return max(
            cost.flops / self.flops_rate(dtype),
            (cost.bytes_read + cost.bytes_written) / self.memory_bandwidth,
            cost.transcendentals / self.transcendental_rate,
        )

    def transfer_time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` one way over the host link (offload or reload).

        >>> get_profile("a100").transfer_time(25e9)
        1.0
        """
        return float(nbytes) / self.host_bandwidth


def _dtype_name(dtype: Any) -> str:
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


# ----------------------------------------------------------------------------- built-ins

_H100_FLOPS = {
    # NVIDIA H100 Tensor Core GPU datasheet, SXM5 column, dense (no sparsity):
    # FP8 3,958 / 2 ; BF16 & FP16 1,979 / 2 = 989 TFLOPS; TF32 989 / 2 = 494 TFLOPS;
    # FP32 67 TFLOPS (CUDA cores); FP64 34 TFLOPS (67 on tensor cores); INT8 1,979 TOPS dense.
    # float32 uses the non-tensor-core 67 TFLOPS: conservative, and what JAX gets when the
    # matmul precision is "highest". With TF32 ("default"/"high" precision on Ampere+) f32
    # matmuls run up to 494 TFLOPS; register an overriding profile for that.
    "bfloat16": 989e12,
    "float16": 989e12,
    "float32": 67e12,
    "float64": 67e12,
    "int8": 1979e12,
    "float8_e4m3fn": 1979e12,
    "float8_e5m2": 1979e12,
    "default": 67e12,
}

_BUILTINS = (
    DeviceProfile(
        name="h100",
        peak_flops=_H100_FLOPS,
        # Datasheet: HBM3 3.35 TB/s, 80 GB (the device has 80 GiB of HBM3).
        memory_bandwidth=3.35e12,
        # PCIe Gen5 x16 is 64 GB/s per direction; ~55 GB/s is a typical measured pinned
        # copy rate (assumption).
        host_bandwidth=55e9,
        memory_bytes=80 * GiB,
        # Assumption: 16 SFU ops/clk/SM (Hopper whitepaper) x 132 SMs x 1.83 GHz.
        transcendental_rate=16 * 132 * 1.83e9,
        description="NVIDIA H100 SXM5 80GB (datasheet peaks, dense; fp32 = non-tensor 67 TFLOPS)",
    ),
    DeviceProfile(
        name="h200",
        # NVIDIA H200 datasheet (SXM): same Hopper compute as H100 SXM.
        peak_flops=_H100_FLOPS,
        # Datasheet: 141 GB HBM3e at 4.8 TB/s.
        memory_bandwidth=4.8e12,
        host_bandwidth=55e9,  # PCIe Gen5 x16, as for h100 (assumption)
        memory_bytes=141 * GB,
        transcendental_rate=16 * 132 * 1.83e9,  # as for h100 (assumption)
        description="NVIDIA H200 SXM 141GB (datasheet peaks, dense; fp32 = non-tensor 67 TFLOPS)",
    ),
    DeviceProfile(
        name="gh200",
        # NVIDIA GH200 Grace Hopper Superchip datasheet: H100 compute, 96 GB HBM3 at 4 TB/s
        # (the 144 GB HBM3e variant has 4.9 TB/s), NVLink-C2C 900 GB/s total = 450 GB/s
        # per direction to the Grace CPU's LPDDR5X.
        peak_flops=_H100_FLOPS,
        memory_bandwidth=4.0e12,
        host_bandwidth=450e9,
        memory_bytes=96 * GB,
        transcendental_rate=16 * 132 * 1.83e9,  # as for h100 (assumption)
        description="NVIDIA GH200 96GB HBM3, NVLink-C2C host link (datasheet peaks, dense)",
    ),
    DeviceProfile(
        name="a100",
        # NVIDIA A100 Tensor Core GPU datasheet, SXM 80GB column, dense:
        # BF16/FP16 312 TFLOPS, TF32 156, FP32 19.5 (CUDA cores), FP64 19.5 (tensor cores),
        # INT8 624 TOPS. float32 uses the non-tensor 19.5 TFLOPS, as for h100.
        peak_flops={
            "bfloat16": 312e12,
            "float16": 312e12,
            "float32": 19.5e12,
            "float64": 19.5e12,
            "int8": 624e12,
            "default": 19.5e12,
        },
        memory_bandwidth=2.0e12,  # datasheet: HBM2e 2,039 GB/s
        # PCIe Gen4 x16 is 32 GB/s per direction; ~25 GB/s effective (assumption).
        host_bandwidth=25e9,
        memory_bytes=80 * GiB,
        # Assumption: 16 SFU ops/clk/SM x 108 SMs x 1.41 GHz.
        transcendental_rate=16 * 108 * 1.41e9,
        description="NVIDIA A100 SXM4 80GB (datasheet peaks, dense; fp32 = non-tensor 19.5 TFLOPS)",
    ),
    DeviceProfile(
        name="tpu-v5e",
        # Google Cloud TPU v5e system architecture page: 197 TFLOPS bf16, 394 TOPS int8,
        # 16 GiB HBM2 at 819 GB/s per chip.
        peak_flops={
            "bfloat16": 197e12,
            # f32 matmuls run on the bf16 MXU; JAX's default precision on TPU is one bf16
            # pass, so f32 gets the bf16 peak ("highest" precision is ~6x slower).
            "float32": 197e12,
            "int8": 394e12,
            # Assumption: f64 is emulated in software; a rough guess.
            "float64": 1e12,
            "default": 197e12,
        },
        memory_bandwidth=819e9,
        host_bandwidth=25e9,  # assumption: no published per-chip host DMA rate
        memory_bytes=16 * GiB,
        transcendental_rate=2e12,  # assumption: order of magnitude of the vector unit
        description="Google TPU v5e (v5 lite) single chip (Cloud TPU docs; host link and "
        "transcendental rate are assumptions)",
    ),
    DeviceProfile(
        name="tpu-v4",
        # Google Cloud TPU v4 system architecture page: 275 TFLOPS bf16 (and int8),
        # 32 GiB HBM2 at 1,200 GB/s per chip.
        peak_flops={
            "bfloat16": 275e12,
            "float32": 275e12,  # one bf16 pass at JAX's default precision, as for v5e
            "int8": 275e12,
            "float64": 1e12,  # assumption: emulated
            "default": 275e12,
        },
        memory_bandwidth=1.2e12,
        host_bandwidth=25e9,  # assumption, as for v5e
        memory_bytes=32 * GiB,
        transcendental_rate=2e12,  # assumption
        description="Google TPU v4 single chip (Cloud TPU docs; host link and transcendental "
        "rate are assumptions)",
    ),
    DeviceProfile(
        name="cpu",
        # Assumption: a modest multi-core x86 host (a few AVX2/AVX-512 cores), not measured.
        # bf16/fp16 arithmetic is mostly emulated through f32 on CPUs, hence slower.
        peak_flops={
            "float32": 100e9,
            "float64": 50e9,
            "bfloat16": 50e9,
            "float16": 50e9,
            "int8": 100e9,
            "default": 100e9,
        },
        memory_bandwidth=20e9,  # assumption: a couple of DDR4/DDR5 channels, achieved
        host_bandwidth=20e9,  # host == device: "offload" is a copy within the same DRAM
        memory_bytes=16 * GiB,  # assumption: placeholder, not the machine's actual RAM
        transcendental_rate=10e9,  # assumption
        description="local CPU (order-of-magnitude assumptions, not measured)",
    ),
)

_REGISTRY: dict[str, DeviceProfile] = {p.name: p for p in _BUILTINS}


def register_profile(profile: DeviceProfile, *, overwrite: bool = False) -> DeviceProfile:
    """Add a profile to the registry under ``profile.name``.

    Args:
      profile: the profile to add.
      overwrite: replace an existing profile of the same name instead of raising.

    Returns:
      ``profile``.

    Raises:
      AutorematError: the name is taken and ``overwrite`` is False.

    >>> import dataclasses
    >>> tf32 = dataclasses.replace(get_profile("h100"), name="h100-tf32",
    ...     peak_flops={**get_profile("h100").peak_flops, "float32": 494e12})
    >>> register_profile(tf32).name
    'h100-tf32'
    """
    if not isinstance(profile, DeviceProfile):
        raise TypeError(f"register_profile expects a DeviceProfile, got {type(profile).__name__}")
    if profile.name in _REGISTRY and not overwrite:
        raise AutorematError(
            f"a device profile named {profile.name!r} is already registered; "
            "pass overwrite=True to replace it or choose another name"
        )
    _REGISTRY[profile.name] = profile
    return profile


def get_profile(name_or_profile: str | DeviceProfile) -> DeviceProfile:
    """The registered profile of that name; a ``DeviceProfile`` is returned as is.

    Raises:
      AutorematError: no profile of that name; the message lists the known names.

    >>> get_profile("h100").memory_bandwidth
    3350000000000.0
    """
    if isinstance(name_or_profile, DeviceProfile):
        return name_or_profile
    if not isinstance(name_or_profile, str):
        raise TypeError(
            f"expected a profile name (str) or DeviceProfile, got {type(name_or_profile).__name__}"
        )
    try:
        return _REGISTRY[name_or_profile]
    except KeyError:
        raise AutorematError(
            f"unknown device profile {name_or_profile!r}; known profiles: "
            f"{', '.join(list_profiles())} (add one with register_profile)"
        ) from None


def list_profiles() -> tuple[str, ...]:
    """Names of all registered profiles, sorted.

    >>> {"h100", "h200", "a100", "tpu-v5e", "cpu"} <= set(list_profiles())
    True
    """
    return tuple(sorted(_REGISTRY))


# (substring of device_kind, upper-cased) -> profile name; first match wins.
_GPU_KINDS = (("GH200", "gh200"), ("H200", "h200"), ("H100", "h100"), ("A100", "a100"))
_TPU_KINDS = (("V5 LITE", "tpu-v5e"), ("V5E", "tpu-v5e"), ("V4", "tpu-v4"))


def detect_profile(device: Any = None) -> DeviceProfile:
    """The built-in profile matching ``device`` (default: ``jax.devices()[0]``).

    Matches on ``device.platform`` and ``device.device_kind``. An unrecognised GPU falls
    back to ``h100``, an unrecognised TPU to ``tpu-v5e``, any other platform to ``cpu``,
    each with a warning naming the device kind.

    >>> detect_profile().name   # on the CPU test machine
    'cpu'
    """
    if device is None:
        import jax

        device = jax.devices()[0]
    platform = str(getattr(device, "platform", "")).lower()
    kind = str(getattr(device, "device_kind", ""))
    upper = kind.upper()
    if platform == "cpu":
        return get_profile("cpu")
    if platform in ("gpu", "cuda", "rocm"):
        table, fallback = _GPU_KINDS, "h100"
    elif platform == "tpu":
        table, fallback = _TPU_KINDS, "tpu-v5e"
    else:
        table, fallback = (), "cpu"
    for needle, name in table:
        if needle in upper:
            return get_profile(name)
    warnings.warn(
        f"no device profile for {platform} device kind {kind!r}; using {fallback!r}. "
        "Register a matching DeviceProfile and pass profile=... for accurate time estimates.",
        stacklevel=2,
    )
    return get_profile(fallback)
