"""autoremat: automatic gradient checkpointing (rematerialization) for JAX.

Give it a loss function and a memory budget; it returns the same function, rewritten so
that its gradient fits the budget at the least extra time.

The pipeline is three packages: `autoremat.graph` (trace and cost), `autoremat.solver`
(decide), `autoremat.runtime` (realize, export, validate).
"""

from autoremat._errors import AutorematError
from autoremat._errors import BudgetError
from autoremat._errors import InfeasibleBudgetError
from autoremat._errors import PlanFormatError
from autoremat._errors import PlanMismatchError
from autoremat._errors import ShardingUnknownError
from autoremat._errors import SolverError
from autoremat._errors import UnsupportedFunctionError
from autoremat._fit import FitResult
from autoremat._fit import fit
from autoremat._optimize import Optimized
from autoremat._optimize import optimize
from autoremat._xla import configure_cpu_flags
from autoremat.graph._inspect import inspect
from autoremat.runtime import Plan
from autoremat.runtime import apply
from autoremat.runtime import validate
from autoremat._units import parse_budget

__version__ = "0.1.0"

__all__ = [
    "AutorematError",
    "BudgetError",
    "FitResult",
    "InfeasibleBudgetError",
    "Optimized",
    "Plan",
    "PlanFormatError",
    "PlanMismatchError",
    "ShardingUnknownError",
    "SolverError",
    "UnsupportedFunctionError",
    "apply",
    "configure_cpu_flags",
    "fit",
    "inspect",
    "optimize",
    "parse_budget",
    "validate",
]
