"""Batch severity scoring: score every open insurance claim overnight, in chunks.

``claims`` is the domain (synthetic extract, validation, the one scoring function);
``ledger`` is where scores, quarantined rows and the signed run manifest are written.
"""
