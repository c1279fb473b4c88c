"""Layer 3: privacy accounting: the privacy specs of every mechanism family, events, the
ledger, accountants, calibration and the analyses of the papers.

Mechanisms produce events (dp-accounting ``DpEvent``s, or fedpriv's own
:class:`~fedpriv.accounting.core.event.FedprivEvent` dataclasses); a
:class:`~fedpriv.accounting.core.ledger.PrivacyLedger` keeps them as ``(event, count)`` runs and
recomputes ε from them; a family's :class:`~fedpriv.accounting.core.privacy_spec.PrivacySpec`
states the events of its releases. See ``docs/accounting.md`` and ``fedpriv-account``.
"""
