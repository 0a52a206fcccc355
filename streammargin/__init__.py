"""streammargin: online large-margin classifiers for event streams, River-compatible."""

from __future__ import annotations

from streammargin import state
from streammargin.alma import ALMAClassifier
from streammargin.state import from_state

__version__ = "0.1.0"

__all__ = ["ALMAClassifier", "from_state", "state"]
