"""Layer 3, accountants behind one protocol (:mod:`fedpriv.accounting.core.accountant`, listed
in :mod:`.registry`): PLD on common grids, RDP at the best order, exact mu-GDP (f-DP) and the
Monte Carlo estimate of random allocation (an estimate, never a budget); with their toolkits,
(epsilon, delta) composition among them.
"""
