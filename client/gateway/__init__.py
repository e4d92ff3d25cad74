"""`client gateway`: the OpenAI Batch API (Files, Batches, Models) in front of Quarry, paying
and signing with the client's own key. `app` routes, `store` SQLite, `translate` OpenAI lines
to Quarry lines, `runner` the loop that submits and follows the batches."""
