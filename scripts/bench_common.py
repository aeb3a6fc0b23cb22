"""What ``fedica-bench``'s benchmarks share: the synthetic workload of FedGEM's server step.

Both :mod:`fedica.scripts.bench` (the server step from 1k to 100k components) and
:mod:`fedica.scripts.bench_scale` (1,000,000 components) time the step on it.
"""

from __future__ import annotations

import numpy as np


def synthetic_components(
    m: int, d: int, seed: int = 0, overlap: float = 0.4, n_true: int = 10
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """m components of m/10 clients with 10 components each, around ``n_true`` true centres.

    Each centre is the true centre plus N(0, 0.1^2) noise per coordinate; ball radii are
    ``overlap`` x 0.1 x U(0.5, 1.5), so ``overlap`` sets how many balls meet (0.4: almost none
    with 100 members per cluster, as late in a run; 1: about 0.45 m overlapping pairs, a third
    of the components merge; 2: nearly every pair within a cluster meets).
    With ``n_true`` = 10 the components per true cluster grow with m (G grows, K fixed), and so
    do the overlapping pairs; with ``n_true`` = m / 100 every cluster keeps 100 members.

    Parameters
    ----------
    m : int
        Components in all (a multiple of 10).
    d : int
        Dimension.
    seed : int, default=0
    overlap : float, default=0.4
    n_true : int, default=10
        True centres.

    Returns
    -------
    centers : ndarray of shape (m, d)
    eps : ndarray of shape (m,)
        Squared ball radii.
    owners : ndarray of shape (m,)
        The client of each component (10 consecutive components per client).
    weights : ndarray of shape (m,)
        All ones.
    """
    rng = np.random.default_rng(seed)
    n_clients = m // 10
    truth = rng.normal(scale=10.0 * max(1.0, (n_true / 10) ** (1 / d)), size=(n_true, d))
    owners = np.repeat(np.arange(n_clients), 10)
    ids = np.concatenate([rng.choice(n_true, 10, replace=False) for _ in range(n_clients)])
    centers = truth[ids] + rng.normal(scale=0.1, size=(m, d))
    radii = overlap * 0.1 * rng.uniform(0.5, 1.5, size=m)
    return centers, radii**2, owners, np.ones(m)
