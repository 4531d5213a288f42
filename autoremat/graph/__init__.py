"""Stage 1: trace a function to a dataflow graph with memory, FLOP and time costs."""

from autoremat.graph._costs import OpCost as OpCost
from autoremat.graph._costs import aval_bytes as aval_bytes
from autoremat.graph._costs import conservatively_costed as conservatively_costed
from autoremat.graph._costs import eqn_cost as eqn_cost
from autoremat.graph._costs import jaxpr_cost as jaxpr_cost
from autoremat.graph._costs import register_cost_rule as register_cost_rule
from autoremat.graph._graph import Graph as Graph
from autoremat.graph._graph import OpInfo as OpInfo
from autoremat.graph._graph import ValueInfo as ValueInfo
from autoremat.graph._graph import build_graph as build_graph
from autoremat.graph._graph import graph_from_traced as graph_from_traced
from autoremat.graph._inspect import InspectReport as InspectReport
from autoremat.graph._inspect import InspectRow as InspectRow
from autoremat.graph._inspect import inspect as inspect
from autoremat.graph._profiles import DeviceProfile as DeviceProfile
from autoremat.graph._profiles import detect_profile as detect_profile
from autoremat.graph._profiles import get_profile as get_profile
from autoremat.graph._profiles import list_profiles as list_profiles
from autoremat.graph._profiles import register_profile as register_profile
from autoremat.graph._trace import Traced as Traced
from autoremat.graph._trace import structure_fingerprint as structure_fingerprint
from autoremat.graph._trace import trace as trace

__all__ = [
    "trace",
    "Traced",
    "structure_fingerprint",
    "build_graph",
    "graph_from_traced",
    "Graph",
    "ValueInfo",
    "OpInfo",
    "OpCost",
    "eqn_cost",
    "jaxpr_cost",
    "aval_bytes",
    "register_cost_rule",
    "conservatively_costed",
    "DeviceProfile",
    "get_profile",
    "register_profile",
    "list_profiles",
    "detect_profile",
    "inspect",
    "InspectReport",
    "InspectRow",
]
