"""Chain layer: contract artifacts, deployment, typed wrappers and the local devnet."""
