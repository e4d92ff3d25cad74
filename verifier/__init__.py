"""Quarry verifier package."""
