"""fedica: robust federated ICA (RF-ICA) and federated generalized EM (FedGEM)."""

__version__ = "0.1.0"
