"""fedpriv's Hydra launcher: ``fedpriv -m ... hydra/launcher=ray`` runs a sweep's jobs on an
existing Ray cluster (see :mod:`fedpriv.run.sweep`)."""
