"""fedica's Flower ClientApp (``fedica.clients.app:app``) and :func:`make_client_app` for a user's own data."""

from fedica.clients.app import make_client_app

__all__ = ["make_client_app"]
