"""A site's state between messages (``fedica.clients.app.ContextState``), kept in its Flower context."""

import numpy as np
import pytest
from fedica.clients.app import STATE_KEY, ContextState
from flwr.app import ArrayRecord, Context, RecordDict


def _context():
    return Context(run_id=1, node_id=2, node_config={"partition-id": 0}, state=RecordDict(), run_config={})


def test_the_state_keeps_every_array_bit_for_bit_across_messages_and_forgets_a_deleted_one():
    context = _context()
    centroids, variances = np.random.default_rng(0).normal(size=(3, 4)), np.array([1e-300, 2.0, np.pi])
    first = ContextState(context)
    first["centroids"], first["variances"] = centroids, variances
    first["centroids"] = centroids * 2  # replaced, the other array kept
    later = ContextState(context)  # the next message's view of the same context
    assert sorted(later) == ["centroids", "variances"] and len(later) == 2
    np.testing.assert_array_equal(later["centroids"], centroids * 2)
    np.testing.assert_array_equal(later["variances"], variances)
    assert isinstance(context.state[STATE_KEY], ArrayRecord)
    del later["variances"]
    assert list(ContextState(context)) == ["centroids"]
    with pytest.raises(KeyError):
        ContextState(context)["variances"]
    with pytest.raises(KeyError):
        del ContextState(context)["variances"]


def test_a_fresh_site_has_an_empty_state():
    state = ContextState(_context())
    assert len(state) == 0 and "centroids" not in state
