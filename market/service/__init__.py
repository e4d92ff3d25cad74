"""The market service: the store, the job board, the miner directory, and Celery's work."""
