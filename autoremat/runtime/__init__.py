"""Stage 3: realize plans in JAX, export them, and validate them by compiling."""

from autoremat.runtime._apply import apply
from autoremat.runtime._plan import SCHEMA_VERSION, Plan, Region, ScanPlan, ValueRecord

__all__ = ["apply", "Plan", "Region", "ScanPlan", "ValueRecord", "SCHEMA_VERSION"]
from autoremat.runtime._validate import CompiledStats, ValidationReport, compiled_stats, validate

__all__ += ["CompiledStats", "ValidationReport", "compiled_stats", "validate"]
