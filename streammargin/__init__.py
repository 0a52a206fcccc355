"""streammargin: online large-margin classifiers for event streams, River-compatible."""

from __future__ import annotations

from streammargin import memory, state
from streammargin.alma import ALMAClassifier
from streammargin.auto import AutoClassifier
from streammargin.budget_perceptron import BudgetPerceptron
from streammargin.budget_svm import BudgetSVMClassifier
from streammargin.convex_polytope import ConvexPolytopeClassifier
from streammargin.describe import describe_state
from streammargin.errors import InvalidInput, StateError
from streammargin.kernel_alma import KernelALMAClassifier
from streammargin.mpu import KernelMPUClassifier, LinearMPUClassifier, MPUClassifier
from streammargin.multiclass import OneVsRestClassifier
from streammargin.sbp import SBPClassifier
from streammargin.scaler import StandardScaler
from streammargin.state import from_state

__version__ = "0.1.0"

__all__ = [
    "ALMAClassifier",
    "AutoClassifier",
    "BudgetPerceptron",
    "BudgetSVMClassifier",
    "ConvexPolytopeClassifier",
    "InvalidInput",
    "KernelALMAClassifier",
    "KernelMPUClassifier",
    "LinearMPUClassifier",
    "MPUClassifier",
    "OneVsRestClassifier",
    "SBPClassifier",
    "StandardScaler",
    "StateError",
    "describe_state",
    "from_state",
    "memory",
    "state",
]
