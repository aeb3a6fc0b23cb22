"""The clustering metrics under their documented name: :mod:`fedica.metrics`, which the algorithms use too.

They live at the library's bottom layer (FedGEM's sites and server score with them); the comparators' room
keeps this name for the users and documents that import it from here.
"""

from fedica.metrics import (  # noqa: F401 - the documented names
    adjusted_rand,
    ari_from_contingency,
    contingency,
    k_hat_from_predictions,
    leave_one_out_aris,
    mean_silhouettes,
    silhouette,
    weighted_local_ari,
    weighted_mean,
)

__all__ = [
    "adjusted_rand",
    "ari_from_contingency",
    "contingency",
    "k_hat_from_predictions",
    "leave_one_out_aris",
    "mean_silhouettes",
    "silhouette",
    "weighted_local_ari",
    "weighted_mean",
]
