"""Layer 5: the command lines (``fedpriv``, ``fedpriv-account``, ``fedpriv-report``)."""
