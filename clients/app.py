"""Re-export of the ClientApp builder, which lives in the core (:mod:`fedpriv.client_app`)."""

from fedpriv.client_app import _client_data, make_client_app, train_handler  # noqa: F401
