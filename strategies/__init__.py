"""Server side of fedpriv: Flower strategies and secure aggregators."""
