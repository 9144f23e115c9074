"""Variants of FM recipes that tests run to prove a docstring's claim (not FMs)."""
