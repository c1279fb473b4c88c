"""Layer 3, loss models: the privacy loss of each noise mechanism (dominating pairs, RDP
curves) and its neighbouring relation.
"""
