"""Scoring through real Celery worker processes on a private redis-server: the answers equal
in-process scoring, two workers on one queue share the jobs, and every failure (a worker-side
error, a tampered model, no worker, Redis down) is a ScoringError naming the problem."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from market.local.processes import ManagedProcess, free_port, start_redis
from market.model.create import create_model
from market.protocol.requests import prompt_lines
from verifier.scoring import ScoringError, judge, score_outputs
from verifier.scoring_worker import SCORE_TASK, ScoringClient, scoring_app, start_scoring_worker

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUEUE = "quarry.score.test"
PROMPTS = ["Tell me about the ocean.", "What is the capital of France?",
           "Write a short story about tea.", "The library was quiet."]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("scoring-worker") / "tiny"
    create_model(d)
    return d


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    redis = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield redis.extra["url"]
    finally:
        redis.stop()


@pytest.fixture(scope="module")
def workers(redis_url: str, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[list[ManagedProcess]]:
    logs = tmp_path_factory.mktemp("logs")
    procs: list[ManagedProcess] = []
    try:
        for i in range(2):
            procs.append(start_scoring_worker(redis_url, QUEUE, logs / f"scorer-{i}.log"))
        yield procs
    finally:
        for p in procs:
            p.stop()
    assert not [pid for p in procs for pid in p.group()], "a scoring worker outlived stop()"


def lines() -> list[dict]:
    greedy = prompt_lines(PROMPTS[:2], model="quarry-tiny", max_tokens=12)
    sampled = prompt_lines(PROMPTS[2:], model="quarry-tiny", max_tokens=12, temperature=0.8,
                           seed=42)
    return [{**line, "custom_id": f"request-{i}"} for i, line in enumerate(greedy + sampled)]


@pytest.mark.timeout(180)
def test_worker_scores_equal_in_process_scoring(model_dir: Path, redis_url: str,
                                                workers: list[ManagedProcess]) -> None:
    from market.engine.torch_engine import TorchEngine

    engine = TorchEngine(model_dir)
    reqs = [engine.request_from_line(line) for line in lines()]
    honest = [list(o.token_ids) for o in engine.generate(reqs)]
    outputs = honest[:3] + [[7, 8, 9] + honest[3][3:]]  # one answer tampered with
    client = ScoringClient(redis_url, QUEUE, model_dir, timeout_s=120)
    remote = client.score(lines(), outputs)
    assert remote == score_outputs(engine, reqs, outputs)
    assert judge(remote[:3]).passed and not judge(remote[3:]).passed
    finish = ["length"] * len(outputs)
    assert client.score(lines(), outputs, finish) == score_outputs(engine, reqs, outputs, finish)
    with pytest.raises(ScoringError, match="4 outputs but 1 finish reasons"):
        client.score(lines(), outputs, ["stop"])
    assert client.score([], []) == []
    client.close()


@pytest.mark.timeout(180)
def test_worker_checks_stop_strings_and_texts(model_dir: Path, redis_url: str,
                                              workers: list[ManagedProcess]) -> None:
    """Lines with `stop` reach the worker's engine; an honest stop passes and a miner that
    runs past its stop string is caught, as in process."""
    from market.engine.torch_engine import TorchEngine

    engine = TorchEngine(model_dir)
    plain = engine.generate([engine.request_from_line(line) for line in lines()[:2]])
    # a stop string from the middle of each greedy output's text
    cuts = [next(o.text[i:i + 2] for i in range(3, len(o.text) - 2)
                 if "\ufffd" not in o.text[i:i + 2]) for o in plain]
    stopped = [{**line, "body": {**line["body"], "stop": [cut]}}
               for line, cut in zip(lines()[:2], cuts, strict=True)]
    reqs = [engine.request_from_line(line) for line in stopped]
    honest = engine.generate(reqs)
    assert all(o.finish_reason == "stop" for o in honest)
    outputs = [list(honest[0].token_ids), list(plain[1].token_ids)]  # the second ran past
    finish = [honest[0].finish_reason, plain[1].finish_reason]
    texts = [honest[0].text, plain[1].text]
    client = ScoringClient(redis_url, QUEUE, model_dir, timeout_s=120)
    remote = client.score(stopped, outputs, finish, texts)
    assert remote == score_outputs(engine, reqs, outputs, finish, texts)
    assert remote[0].possible and "ran past a stop string" in remote[1].problem
    with pytest.raises(ScoringError, match="2 outputs but 1 texts"):
        client.score(stopped, outputs, finish, texts[:1])
    client.close()


@pytest.mark.timeout(180)
def test_two_workers_share_one_queue(model_dir: Path, redis_url: str,
                                     workers: list[ManagedProcess]) -> None:
    batch = lines()
    ids = [[5, 6, 7]] * len(batch)

    def job(_: int) -> int:
        client = ScoringClient(redis_url, QUEUE, model_dir, timeout_s=120)
        try:
            return len(client.score(batch, ids))
        finally:
            client.close()

    def totals() -> dict[str, int]:
        app = scoring_app(redis_url)
        try:
            nodes = [w.extra["node"] for w in workers]
            stats = app.control.inspect(destination=nodes, timeout=5).stats() or {}
        finally:
            app.close()
        return {n: stats.get(n, {}).get("total", {}).get(SCORE_TASK, 0) for n in nodes}

    before = totals()
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(job, range(8))) == [len(batch)] * 8
    after = totals()
    done = {n: after[n] - before[n] for n in after}
    assert all(count > 0 for count in done.values()), done
    assert sum(done.values()) == 8


@pytest.mark.timeout(180)
def test_worker_errors_surface_as_scoring_errors(model_dir: Path, redis_url: str,
                                                 workers: list[ManagedProcess],
                                                 tmp_path: Path) -> None:
    client = ScoringClient(redis_url, QUEUE, model_dir, timeout_s=120)
    bad = {**lines()[0], "method": "GET"}
    with pytest.raises(ScoringError, match="refused the job: request line 0: method"):
        client.score([bad], [[5]])
    tampered = tmp_path / "tampered"
    shutil.copytree(model_dir, tampered)
    config = tampered / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps": 1e-05',
                                                 '"rms_norm_eps": 1e-06'))
    evil = ScoringClient(redis_url, QUEUE, tampered, timeout_s=120)
    with pytest.raises(ScoringError, match="config.json"):
        evil.score(lines()[:1], [[5]])
    # The client refuses a malformed payload before enqueuing anything.
    with pytest.raises(ScoringError, match="2 request lines but 1 outputs"):
        client.score(lines()[:2], [[5]])
    with pytest.raises(ScoringError, match="output 0: every token id must be an integer"):
        client.score(lines()[:1], [["5"]])
    client.close()
    evil.close()


@pytest.mark.timeout(60)
def test_no_worker_and_no_redis_are_named(model_dir: Path, redis_url: str) -> None:
    silent = ScoringClient(redis_url, "quarry.score.nobody", model_dir, timeout_s=1)
    with pytest.raises(ScoringError, match="no scoring worker on queue quarry.score.nobody "
                                           "answered within 1s"):
        silent.score(lines()[:1], [[5]])
    silent.close()
    down = ScoringClient(f"redis://127.0.0.1:{free_port()}/0", QUEUE, model_dir, timeout_s=5)
    with pytest.raises(ScoringError, match="cannot reach Redis at redis://127.0.0.1"):
        down.score(lines()[:1], [[5]])
    down.close()
    with pytest.raises(ScoringError, match="not a Redis URL"):
        ScoringClient("http://127.0.0.1:6379", QUEUE, model_dir)
    with pytest.raises(ScoringError, match="timeout_s must be a positive number"):
        ScoringClient(redis_url, QUEUE, model_dir, timeout_s=0)
