"""Layer 3, accountants: PLD on common grids, RDP at the best order, exact mu-GDP (f-DP),
(epsilon, delta) composition, and the Monte Carlo estimate of random allocation.
"""
