"""DeServe-style pipelined engine: layer stages in separate processes, microbatch scheduling.

`PipelineEngine` (engine.py) is the driver; `python -m market.engine.pipeline.stage` runs one
stage; scheduler.py holds the microbatch formula; wire.py the message format; swarm.py the
StageRef and per-microbatch routes over a swarm's members; auth.py their CURVE keys.
Import `PipelineEngine` from `market.engine.pipeline.engine` (this package stays cheap).
"""
