"""Re-export of the client-algorithm interface, now in the core (:mod:`fedpriv.algorithm`)."""

from fedpriv.algorithm import ClientAlgorithm, ClientData, TrainContext  # noqa: F401
