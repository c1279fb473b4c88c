"""Layer 1: the models (:mod:`fedpriv.models.zoo.zoo`) and their evaluation."""
