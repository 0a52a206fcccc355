"""Numba hot loops of every model, kept in one place (`njit(cache=True)`, float64 arrays).

Model modules in `streammargin` hold the River plumbing; the arithmetic of each update rule lives
here, one module per algorithm family, working on contiguous arrays owned by the model.
"""
