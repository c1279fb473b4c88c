"""Client side of fedpriv: Flower ClientApp handlers and local DP algorithms."""
