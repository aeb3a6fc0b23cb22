"""An RF-ICA estimate as a fitted ``mne.preprocessing.ICA``: MNE's plots, ``apply`` and ``save`` on the federation's model.

MNE's ICA computes its sources as ``unmixing_matrix_ @ pca_components_[:n] @ ((data - pca_mean_) / pre_whitener_)``
and projects back through every PCA row it keeps, the ``n`` components' and the residual ones.
An RF-ICA unmixing ``W`` (``n x channels``) is put in that form as MNE's own EEGLAB import does
(``mne.preprocessing.read_ica_eeglab``): the SVD ``W = U S V^T`` gives ``unmixing_matrix_ = U S`` and the
first ``n`` PCA rows ``V^T``; unlike that import, the PCA basis is completed to every channel, so that
``apply(raw, exclude=...)`` removes the excluded components and keeps what lies outside their span
(the residual subspace), as an ICA fitted by MNE with fewer components than channels does.
No scaling by channel type (``pre_whitener_`` ones): the sources are in the units the sites' data had.
MNE has no public constructor for a fitted ICA; the attributes set here are those ``read_ica_eeglab`` and
``read_ica`` set, which ``ICA.save`` writes and ``read_ica`` reads back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EEG_EXTRA = 'pip install "fedica[eeg]"'


def fitted_mne_ica(mixing, mean, info, *, channel_names: Sequence[str] | None = None, covariance=None,
                   method: str = "picard"):
    """A fitted ``mne.preprocessing.ICA`` whose sources are ``pinv(mixing) @ (x - mean)``.

    Parameters
    ----------
    mixing : ndarray of shape (n_channels, n_components)
    mean : ndarray of shape (n_channels,)
    info : mne.Info
        The recording's measurement info: its channels must include the estimate's, named by
        ``channel_names`` (any order, others ignored), or be exactly ``n_channels`` without names.
    channel_names : sequence of str, optional
        The estimate's channels, in its rows' order.
    covariance : ndarray of shape (n_channels, n_channels), optional
        The federation's channel covariance: the PCA rows' variances (``pca_explained_variance_``).
        Without it, their variances under unit-variance sources.
    method : {"picard", "fastica"}
        The sites' solver, recorded as MNE's ``method``.

    Returns
    -------
    ica : mne.preprocessing.ICA
    """
    try:
        import mne  # an optional extra: only an MNE user asks for MNE's ICA
    except ImportError:
        raise ImportError(f"to_mne needs MNE: {EEG_EXTRA}") from None
    n_channels, n_components = mixing.shape
    info = _estimate_info(mne, info, n_channels, channel_names)
    unmixing = np.linalg.pinv(mixing)
    left, singular, basis = np.linalg.svd(unmixing, full_matrices=True)  # basis: every channel's direction, n first
    shape = mixing @ mixing.T if covariance is None else covariance
    # MNE refuses n_components=1 at construction ("not supported"); the fitted count below is what it uses.
    ica = mne.preprocessing.ICA(n_components=n_components if n_components > 1 else None, method=method)
    ica.current_fit = "raw"
    ica.info = info
    ica.ch_names = list(info["ch_names"])
    ica.n_components_ = n_components
    ica.n_pca_components = None
    ica._max_pca_components = n_channels  # noqa: SLF001 - as read_ica sets it: apply() keeps every PCA row
    ica.pre_whitener_ = np.ones((n_channels, 1))
    ica.pca_mean_ = np.array(mean, dtype=np.float64)
    ica.pca_components_ = basis
    ica.pca_explained_variance_ = np.einsum("ic,cd,id->i", basis, shape, basis)
    ica.unmixing_matrix_ = left * singular
    ica.reject_ = None
    ica._update_mixing_matrix()  # noqa: SLF001 - MNE's own steps after setting the matrices (read_ica_eeglab)
    ica._update_ica_names()  # noqa: SLF001
    return ica


def _estimate_info(mne, info, n_channels: int, channel_names: Sequence[str] | None):
    """``info`` picked to the estimate's channels in its order; ValueError (one line) when it lacks them."""
    if not isinstance(info, mne.Info):
        raise TypeError(f"info must be an mne.Info (raw.info), got {type(info).__name__}")
    if channel_names is None:
        if len(info["ch_names"]) != n_channels:
            raise ValueError(f"info has {len(info['ch_names'])} channels, the estimate {n_channels}; fit on DataFrames "
                             "named by channel (or pass info picked to the fitted channels)")
        return info.copy()
    missing = [name for name in channel_names if name not in info["ch_names"]]
    if missing:
        raise ValueError(f"info lacks the estimate's channel(s) {', '.join(missing)}")
    return mne.pick_info(info, [info["ch_names"].index(name) for name in channel_names])
