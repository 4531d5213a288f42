"""The typed exceptions autoremat raises.

Every message quotes the offending value and says what to do about it.
"""

__all__ = [
    "AutorematError",
    "BudgetError",
    "InfeasibleBudgetError",
    "UnsupportedFunctionError",
    "PlanFormatError",
    "PlanMismatchError",
    "SolverError",
    "ShardingUnknownError",
]


class AutorematError(Exception):
    """Base class of every error autoremat raises on purpose."""


class BudgetError(AutorematError, ValueError):
    """A memory budget that cannot be parsed or makes no sense."""


class InfeasibleBudgetError(AutorematError):
    """The budget is below the lowest peak any plan can reach.

    Attributes:
      budget: the budget in bytes.
      lowest: the lowest reachable peak in bytes (as predicted or compiled).
    """

    def __init__(self, message: str, *, budget: int, lowest: int):
        super().__init__(message)
        self.budget = budget
        self.lowest = lowest


class UnsupportedFunctionError(AutorematError, TypeError):
    """A function autoremat cannot plan for (effects, non-array outputs, ...)."""


class PlanFormatError(AutorematError, ValueError):
    """A plan file that is corrupt, foreign, or of an unknown schema version."""


class PlanMismatchError(AutorematError, ValueError):
    """A saved plan applied to a function whose traced structure differs."""


class SolverError(AutorematError, RuntimeError):
    """A solver failed for a reason other than an infeasible budget."""


class ShardingUnknownError(AutorematError, ValueError):
    """Inside `jax.jit`, the arguments' shardings (so the per-device budget's meaning) are unknown."""
