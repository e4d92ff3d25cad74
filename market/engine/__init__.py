"""Inference engines shared by miners (generate) and verifiers (score)."""
