"""Quarry market package."""
