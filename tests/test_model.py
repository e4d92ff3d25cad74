"""The embedded tiny model: deterministic bytes and modelId, manifests, verified loading, CLI."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from market.engine.text import request_from_body, request_from_line
from market.errors import QuarryError
from market.model.create import create_model
from market.model.loading import load_model
from market.model.manifest import (
    MANIFEST_NAME,
    Manifest,
    ModelError,
    ModelFileMismatch,
    build_manifest,
    load_manifest,
    write_manifest,
)
from market.model.prompts import (
    PromptError,
    encode_chat,
    encode_prompt,
    format_chat,
)
from market.model.tokenizer import BOS_ID, EOS_ID, train_bpe

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = {"layers": 2, "hidden": 64}


def _digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("model") / "tiny"
    create_model(d, name="tiny", seed=7, **SMALL)
    return d


@pytest.fixture(scope="module")
def loaded(model_dir: Path):
    return load_model(model_dir)


def test_same_arguments_give_identical_bytes_and_model_id(tmp_path: Path) -> None:
    a = create_model(tmp_path / "a", name="tiny", seed=7, **SMALL)
    b = create_model(tmp_path / "b", name="tiny", seed=7, **SMALL)
    assert _digests(tmp_path / "a") == _digests(tmp_path / "b")
    assert a.model_id == b.model_id and len(a.model_id) == 32
    assert a.model_id_hex == "0x" + a.model_id.hex()
    assert set(a.files) == {
        "config.json", "generation_config.json", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    }


# The default model's identity is part of the protocol (receipts carry it, tests and the demo
# use it). If a deliberate change to the corpus, tokenizer, init or manifest moves it, update
# this value and say so in the change's note.
DEFAULT_MODEL_ID = "0x6b69454fa9c1856ab18838ed2975cee46a953be718aedb249f7e75e6f664e0fc"


def test_default_model_id_is_stable_across_machines(tmp_path: Path) -> None:
    assert create_model(tmp_path / "default").model_id_hex == DEFAULT_MODEL_ID


def test_recreating_in_place_is_idempotent(tmp_path: Path) -> None:
    first = create_model(tmp_path / "m", name="tiny", seed=1, **SMALL)
    before = _digests(tmp_path / "m")
    again = create_model(tmp_path / "m", name="tiny", seed=1, **SMALL)
    assert again.model_id == first.model_id and _digests(tmp_path / "m") == before


def test_cheaper_sibling_has_another_id_but_the_same_tokenizer(tmp_path: Path) -> None:
    honest = create_model(tmp_path / "honest", name="tiny", seed=7, layers=3, hidden=64)
    sibling = create_model(tmp_path / "sib", name="tiny", seed=8, layers=1, hidden=64)
    reseeded = create_model(tmp_path / "seed", name="tiny", seed=8, layers=3, hidden=64)
    renamed = create_model(tmp_path / "name", name="other", seed=7, layers=3, hidden=64)
    ids = {m.model_id for m in (honest, sibling, reseeded, renamed)}
    assert len(ids) == 4
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert honest.files[f] == sibling.files[f]
    assert honest.files["model.safetensors"] != reseeded.files["model.safetensors"]


def test_model_id_is_keccak_of_canonical_manifest(model_dir: Path) -> None:
    from eth_utils import keccak

    from market.protocol.canonical import canonical_json_bytes

    m = load_manifest(model_dir)
    on_disk = json.loads((model_dir / MANIFEST_NAME).read_text())
    assert keccak(canonical_json_bytes(on_disk)) == m.model_id
    assert m.architecture == json.loads((model_dir / "config.json").read_text())
    assert Manifest.from_dict(m.to_dict()) == m
    assert build_manifest(model_dir, m.name) == m


def test_tokenizer_round_trips_any_utf8(loaded) -> None:
    _, tok = loaded
    for text in ["Hello world, the market opens.", "héllo 日本語 🎉 \x00\n\t  x", "", "<|eos|> x"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids, clean_up_tokenization_spaces=False) == text
    assert tok("Hi")["input_ids"][0] == BOS_ID
    assert tok.eos_token_id == EOS_ID and len(tok) == 512
    assert len(train_bpe(512)) == 512 - 262


def test_chat_template_matches_python_format(loaded) -> None:
    _, tok = loaded
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = format_chat(msgs)
    assert text == "<|system|>\nBe brief.<|eos|>\n<|user|>\nHi<|eos|>\n<|assistant|>\n"
    ids = encode_chat(tok, msgs)
    assert ids == (BOS_ID, *tok(text, add_special_tokens=False)["input_ids"])
    with pytest.raises(PromptError, match="role"):
        encode_chat(tok, [{"role": "robot", "content": "x"}])


def test_request_helpers(loaded) -> None:
    _, tok = loaded
    r = request_from_body(tok, {"prompt": "Hello", "max_tokens": 5, "seed": 3})
    assert r.prompt_ids == encode_prompt(tok, "Hello") and r.greedy and r.seed == 3
    chat = request_from_body(tok, {"messages": [{"role": "user", "content": "Hi"}],
                                   "max_tokens": 2, "temperature": 0.7, "top_p": 0.9})
    assert chat.temperature == 0.7 and chat.top_p == 0.9 and chat.prompt_ids[0] == BOS_ID
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
                     "max_tokens": 2, "temperature": 0.7, "top_p": 0.9}}
    assert request_from_line(tok, line) == chat
    with pytest.raises(PromptError, match="prompt"):
        request_from_body(tok, {"max_tokens": 3})
    with pytest.raises(PromptError, match="max_tokens"):
        request_from_body(tok, {"prompt": "x", "max_tokens": -1})


def test_loaded_model_is_fp32_llama_with_every_weight(loaded) -> None:
    model, _ = loaded
    assert type(model).__name__ == "LlamaForCausalLM"
    assert all(p.dtype.is_floating_point and p.dtype.itemsize == 4 for p in model.parameters())
    assert not model.training


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_tampered_weights_are_refused_naming_the_file(model_dir: Path, tmp_path: Path) -> None:
    d = _copy(model_dir, tmp_path / "bad")
    data = bytearray((d / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (d / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ModelFileMismatch, match="model.safetensors"):
        load_model(d)


def test_tampered_tokenizer_and_config_are_refused(model_dir: Path, tmp_path: Path) -> None:
    d = _copy(model_dir, tmp_path / "tok")
    (d / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ModelFileMismatch, match="tokenizer_config.json"):
        load_model(d)
    d2 = _copy(model_dir, tmp_path / "missing")
    (d2 / "config.json").unlink()
    with pytest.raises(ModelFileMismatch, match="config.json"):
        load_model(d2)


def test_unlisted_weights_file_is_refused(model_dir: Path, tmp_path: Path) -> None:
    d = _copy(model_dir, tmp_path / "extra")
    (d / "model-extra.safetensors").write_bytes(b"x")
    with pytest.raises(ModelFileMismatch, match="model-extra.safetensors"):
        load_model(d)


def test_manifest_given_by_caller_is_what_counts(model_dir: Path, tmp_path: Path) -> None:
    other = create_model(tmp_path / "other", name="tiny", seed=99, **SMALL)
    with pytest.raises(ModelFileMismatch, match="model.safetensors"):
        load_model(model_dir, manifest=other)


def test_unknown_model_dir_and_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        load_model(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no Quarry manifest"):
        load_model(tmp_path / "empty")
    with pytest.raises(ModelError, match="config.json"):
        build_manifest(tmp_path / "empty", "x")
    (tmp_path / "m.json").write_text('{"format": "nope"}')
    with pytest.raises(ModelError, match="format"):
        load_manifest(tmp_path / "m.json")


def test_weights_that_do_not_fit_are_refused(model_dir: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    d = _copy(model_dir, tmp_path / "short")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    write_manifest(build_manifest(d, "short"), d)
    with pytest.raises(ModelError, match="up_proj"):
        load_model(d)


def test_create_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="layers"):
        create_model(tmp_path / "a", name="x", layers=0, hidden=64, seed=0)
    with pytest.raises(ModelError, match="divisible"):
        create_model(tmp_path / "b", name="x", layers=1, hidden=64, seed=0, heads=3)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    with pytest.raises(ModelError, match="not empty"):
        create_model(tmp_path / "c", name="x", layers=1, hidden=64, seed=0)
    assert issubclass(ModelError, QuarryError)


def test_create_keeps_another_model_unless_replaced(tmp_path: Path) -> None:
    d = tmp_path / "m"
    first = create_model(d, name="x", layers=1, hidden=64, seed=0)
    again = create_model(d, name="x", layers=1, hidden=64, seed=0)  # same command: idempotent
    assert again.model_id == first.model_id
    with pytest.raises(ModelError, match=f"another model \\({first.model_id_hex}\\)"):
        create_model(d, name="x", layers=1, hidden=64, seed=1)
    assert load_manifest(d).model_id == first.model_id  # nothing was overwritten
    load_model(d)  # files still match the manifest
    other = create_model(d, name="x", layers=1, hidden=64, seed=1, replace=True)
    assert load_manifest(d).model_id == other.model_id != first.model_id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary directory left


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run(
        [sys.executable, "-m", "market.cli", "model", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )


def test_cli_create_and_id(tmp_path: Path, model_dir: Path) -> None:
    out = tmp_path / "cli"
    res = _cli("create", "--name", "tiny", "--layers", "2", "--hidden", "64", "--seed", "7",
               "--out", str(out))
    assert res.returncode == 0, res.stderr
    expected = load_manifest(model_dir).model_id_hex
    assert f"modelId {expected}" in res.stdout
    assert "model.safetensors" in res.stdout and "tokenizer.json" in res.stdout
    res = _cli("id", str(out))
    assert res.returncode == 0 and res.stdout.strip() == expected
    (out / "tokenizer.json").write_text("{}")
    res = _cli("id", str(out))
    assert res.returncode == 1 and "tokenizer.json" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = _cli("create", "--layers", "0", "--out", str(tmp_path / "bad"))
    assert res.returncode == 1 and "layers" in res.stderr
    res = _cli("create", "--arch", "gpt2", "--out", str(tmp_path / "gpt2"))
    assert res.returncode == 2 and "invalid choice: 'gpt2'" in res.stderr
    assert "'mistral'" in res.stderr  # the choices are the served architectures


def test_cli_manifest_for_existing_weights(tmp_path: Path, model_dir: Path) -> None:
    d = _copy(model_dir, tmp_path / "hf")
    (d / MANIFEST_NAME).unlink()
    res = _cli("manifest", str(d), "--name", "tiny")
    assert res.returncode == 0, res.stderr
    assert load_manifest(d).model_id == load_manifest(model_dir).model_id
    res = _cli("manifest", str(d), "--name", "tiny")
    assert res.returncode == 1 and "--force" in res.stderr
