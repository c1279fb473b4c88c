"""Layer 3, core of the accounting: the vocabulary, typed CLI parameters, the spec base
(calibration written once), the accounting spec, events, the accountant protocol, the ledger of
event runs, calibration by bisection, lower bounds from realised pairs and group privacy.
"""
