"""Local process management: the devnet stack (Anvil, Redis, market, worker) as child processes."""
