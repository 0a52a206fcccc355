"""What the worker keeps across restarts, as explicit, validated state (never pickle).

- `checkpoint.py`: `CheckpointStore`, each task's checkpoint as framed, chunked, hashed records
  of a compacted topic, and the checks of every record read back;
- `river_state.py`: River's drift detectors as explicit state, restored bit for bit.

Importing the package imports neither River nor numpy: each module imports what it uses.
"""
