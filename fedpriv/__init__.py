"""fedpriv: differentially private federated learning simulations on Flower.

Core library: privacy accounting (:mod:`fedpriv.accounting`), mechanisms (clipping, noise),
samplers, data, models and the simulation runner. Server strategies live in the top-level
package :mod:`strategies`, client algorithms in :mod:`clients`.
"""

__version__ = "0.1.0"
