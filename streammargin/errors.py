"""The two errors a caller of streammargin is meant to handle.

`InvalidInput` is the documented rejection of one example: a feature value that is not a finite
real number, a label the model cannot take. The model is left exactly as it was, so a stream
processor may drop the example (the Kafka worker turns it into a dead letter) and go on. Anything
else a model raises is a bug and should stop the caller.

`StateError` is a saved state that cannot be restored: unreadable bytes, missing or inconsistent
fields, numbers out of range, sizes beyond the allowed memory. Nothing is half-restored.

Both are `ValueError`s, as River users expect of bad input.
"""

from __future__ import annotations

__all__ = ["InvalidInput", "StateError"]


class InvalidInput(ValueError):
    """An example the model refuses (bad feature value or label); the model is untouched."""


class StateError(ValueError):
    """A saved state that cannot be read back."""
