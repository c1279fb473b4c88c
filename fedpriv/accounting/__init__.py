"""Layer 3: privacy accounting, grouped by concept.

* :mod:`~fedpriv.accounting.core`: the vocabulary, events and the ledger that records
  ``(event, count)`` runs, the accountant protocol, the spec base
  (:class:`~fedpriv.accounting.core.privacy_spec.PrivacySpec`: calibration written once, the
  lower-bound hook, the command-line keys derived from its fields), lower bounds from realised
  pairs, group privacy;
* :mod:`~fedpriv.accounting.accountants`: PLD, RDP, exact μ-GDP, (ε, δ) composition and the
  Monte Carlo estimate, one module each;
* :mod:`~fedpriv.accounting.loss_models`: each mechanism's privacy loss (discrete Gaussian,
  Skellam, the f-DP mixture of batch clipping, local randomizers);
* :mod:`~fedpriv.accounting.samplers`: amplification by Poisson subsampling, fixed-size cohorts,
  random allocation, shuffling and check-in slots;
* one module or subpackage per family: ``dpsgd``, ``skellam``, ``batch_clipping``, ``checkin``,
  ``client_level``, ``ftrl``, ``secagg`` (and ``secure_mode``, the lattice variants' accounting).

See ``docs/accounting.md`` and ``fedpriv-account``.
"""
