"""Quarry miner package."""
