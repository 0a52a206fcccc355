"""The shared kernel functions and support-cache primitives against direct numpy formulas."""

from __future__ import annotations

import numpy as np
import pytest

from streammargin.jit import kernels as kjit


def dense(idx, val, n):
    v = np.zeros(n)
    for i, x in zip(idx, val):
        if i >= 0:
            v[i] += x
    return v


@pytest.mark.parametrize(
    ("kernel", "formula"),
    [
        ("linear", lambda a, b: a @ b),
        ("rbf", lambda a, b: np.exp(-0.7 * np.sum((a - b) ** 2))),
        ("poly", lambda a, b: (0.7 * (a @ b) + 1.5) ** 3),
    ],
)
def test_kernel_rows_match_the_formulas(kernel, formula):
    rng = np.random.default_rng(0)
    kp = kjit.kernel_params(kernel, 0.7, 3, 1.5)
    budget, columns = 6, 5
    S = np.zeros((budget, columns))
    slots = np.zeros((budget, kjit.N_COMMON_FIELDS))
    vectors = []
    for slot in range(4):
        idx = rng.permutation(columns)[:3].astype(np.int64)
        val = rng.normal(size=3)
        kjit.store(S, slots, slot, idx, val, kjit.sq_norm(val))
        vectors.append(dense(idx, val, columns))
    # A query with a feature no support vector has (column -1): it counts in ||x||^2 only.
    idx = np.array([0, 3, -1], dtype=np.int64)
    val = np.array([0.5, -1.0, 2.0])
    out = np.zeros(budget)
    kjit.row(kp, S, slots, 4, idx, val, kjit.sq_norm(val), out)
    x_known = dense(idx, val, columns)
    for i, s in enumerate(vectors):
        if kernel == "rbf":
            expected = np.exp(-0.7 * (np.sum((x_known - s) ** 2) + 2.0**2))
        else:
            expected = formula(x_known, s)
        assert out[i] == pytest.approx(expected, rel=1e-12)
    for i in range(4):
        for j in range(4):
            assert kjit.stored_pair(kp, S, slots, i, j) == pytest.approx(
                formula(vectors[i], vectors[j]), rel=1e-12
            )
    assert kjit.self_kernel(kp, vectors[0] @ vectors[0]) == pytest.approx(
        formula(vectors[0], vectors[0]), rel=1e-12
    )


def test_remove_moves_the_last_vector_into_the_hole():
    S = np.arange(12.0).reshape(4, 3)
    slots = np.arange(16.0).reshape(4, 4)
    size = kjit.remove(S, slots, 3, 0)
    assert size == 2
    np.testing.assert_array_equal(S[0], [6.0, 7.0, 8.0])
    np.testing.assert_array_equal(slots[0], [8.0, 9.0, 10.0, 11.0])
    np.testing.assert_array_equal(S[2], 0.0)
    np.testing.assert_array_equal(slots[2], 0.0)


def test_decision_is_the_dual_sum():
    kp = kjit.kernel_params("rbf", 1.0, 1, 0.0)
    S = np.zeros((3, 2))
    slots = np.zeros((3, kjit.N_COMMON_FIELDS))
    for slot, (vec, label, coef) in enumerate([((1.0, 0.0), 1.0, 0.5), ((0.0, 1.0), -1.0, 2.0)]):
        val = np.array(vec)
        kjit.store(S, slots, slot, np.array([0, 1], dtype=np.int64), val, kjit.sq_norm(val))
        slots[slot, kjit.LABEL], slots[slot, kjit.COEF] = label, coef
    x = np.array([1.0, 1.0])
    expected = 0.5 * np.exp(-1.0) - 2.0 * np.exp(-1.0)
    got = kjit.decision(kp, S, slots, 2, np.array([0, 1], dtype=np.int64), x, 2.0)
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad_size", [-1.0, 2.5, 1e9])
def test_a_restored_cache_size_must_be_a_whole_number_within_the_budget(bad_size):
    """numba indexes the cache with its size, without bounds checks: an untrusted checkpoint
    with a bad size must be refused, never loaded."""
    import streammargin
    from streammargin import state

    model = streammargin.BudgetPerceptron(budget=4)
    for i in range(20):
        model.learn_one({"a": float(i % 5), "b": float(i % 3)}, i % 2 == 0)
    saved = state.loads(state.dumps(model.to_state()))
    saved["arrays"]["_st"][kjit.ST_SIZE] = bad_size
    with pytest.raises(state.StateError, match="size"):
        streammargin.from_state(saved)
