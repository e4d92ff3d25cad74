"""Quarry client package."""
