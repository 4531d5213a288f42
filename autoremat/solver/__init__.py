"""Stage 2: decide save / offload / recompute and the checkpoint regions under a budget.

Every chain solver has one signature, `solve_*(problem, budget, *, time_limit=None) ->
SolveResult`, so baselines and solvers compare in one loop.
"""

from autoremat.solver._brute import solve_brute_force
from autoremat._units import format_bytes
from autoremat._units import parse_budget
from autoremat.solver._chain import ChainProblem
from autoremat.solver._chain import Option
from autoremat.solver._chain import Segment
from autoremat.solver._chain import SolveResult
from autoremat.solver._chain import evaluate
from autoremat.solver._chain import lowest_peak
from autoremat.solver._chain import uniform_segments
from autoremat.solver._cpsat import solve_cpsat
from autoremat.solver._dp import solve_dp
from autoremat.solver._greedy import solve_greedy
from autoremat.solver._chain_model import ChainModel
from autoremat.solver._chain_model import build_chain_model
from autoremat.solver._blocks import find_blocks
from autoremat.solver._region import RegionProblem
from autoremat.solver._region import RegionSolution
from autoremat.solver._region import solve_region_cpsat
from autoremat.solver._solve import METHODS
from autoremat.solver._solve import solve

__all__ = [
    "ChainModel",
    "METHODS",
    "ChainProblem",
    "Option",
    "RegionProblem",
    "RegionSolution",
    "Segment",
    "SolveResult",
    "build_chain_model",
    "evaluate",
    "find_blocks",
    "format_bytes",
    "lowest_peak",
    "parse_budget",
    "solve",
    "solve_brute_force",
    "solve_cpsat",
    "solve_dp",
    "solve_greedy",
    "solve_region_cpsat",
    "uniform_segments",
]
