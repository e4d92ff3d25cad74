"""Model manifests: what a modelId commits to, and the check that files on disk match it.

A manifest names the model, copies its architecture config (config.json) and records the
sha256 of every file that can change what the model computes: config, generation config,
safetensors weights (and their index) and the tokenizer files. `modelId` is the keccak256
of the manifest's canonical JSON, so a miner serving other weights serves another modelId,
and a verifier that checks the files before loading scores with exactly the model named.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from market.errors import QuarryError

MANIFEST_NAME = "quarry-manifest.json"
MANIFEST_FORMAT = "quarry-manifest/1"

# Files that change what a model computes; other files in the directory (README, *.bin
# duplicates, images) are not loaded and so not hashed.
EXACT_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.model",
        "vocab.json",
        "merges.txt",
        "added_tokens.json",
        "chat_template.jinja",
        "chat_template.json",
    }
)
WEIGHTS_SUFFIX = ".safetensors"


class ModelError(QuarryError):
    """A model directory or manifest is missing, malformed or does not match."""


class ModelFileMismatch(ModelError):
    """A file's sha256 differs from the manifest (or a loadable file is not listed)."""


def is_model_file(name: str) -> bool:
    """True for files that loading reads, and that a manifest must therefore cover."""
    return name in EXACT_FILES or name.endswith(WEIGHTS_SUFFIX)


def canonical_json(obj: Any) -> bytes:
    """The shared protocol canonical JSON (RFC 8785 style) that modelId commits to."""
    from market.protocol.canonical import canonical_json_bytes

    return canonical_json_bytes(obj)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True, eq=True)
class Manifest:
    """The identity of a model: name, architecture config, and sha256 of each model file."""

    name: str
    architecture: Mapping[str, Any]
    files: Mapping[str, str] = field(default_factory=dict)  # file name -> sha256 hex

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "name": self.name,
            "architecture": dict(self.architecture),
            "files": dict(sorted(self.files.items())),
        }

    def canonical(self) -> bytes:
        return canonical_json(self.to_dict())

    @property
    def model_id(self) -> bytes:
        """keccak256 of the canonical manifest JSON: the bytes32 receipts carry."""
        from eth_utils import keccak

        return bytes(keccak(self.canonical()))

    @property
    def model_id_hex(self) -> str:
        return "0x" + self.model_id.hex()

    @property
    def stop_token_ids(self) -> frozenset[int] | None:
        """The architecture's `eos_token_id` (one id or a list): the tokens a completion may
        end with and must not contain before its end. None when the config names none."""
        eos = self.architecture.get("eos_token_id")
        if isinstance(eos, int) and not isinstance(eos, bool):
            return frozenset([eos])
        if isinstance(eos, list) and eos and all(
                isinstance(e, int) and not isinstance(e, bool) for e in eos):
            return frozenset(eos)
        return None

    @classmethod
    def from_dict(cls, data: Any, source: str = "manifest") -> Manifest:
        if not isinstance(data, dict):
            raise ModelError(f"{source}: expected a JSON object")
        if data.get("format") != MANIFEST_FORMAT:
            raise ModelError(
                f"{source}: unsupported format {data.get('format')!r} "
                f"(expected {MANIFEST_FORMAT!r})"
            )
        name, arch, files = data.get("name"), data.get("architecture"), data.get("files")
        if not isinstance(name, str) or not name:
            raise ModelError(f"{source}: 'name' must be a non-empty string")
        if not isinstance(arch, dict):
            raise ModelError(f"{source}: 'architecture' must be an object")
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in files.items()
        ):
            raise ModelError(f"{source}: 'files' must map file names to sha256 hex digests")
        for fname in files:
            if "/" in fname or "\\" in fname or fname in ("", ".", ".."):
                raise ModelError(f"{source}: file name {fname!r} must be a plain file name")
        return cls(name=name, architecture=arch, files=files)

    def verify(self, model_dir: Path) -> None:
        """Raise ModelFileMismatch naming the first file that differs, is missing or unlisted."""
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise ModelError(f"model directory {model_dir} does not exist")
        for fname, digest in sorted(self.files.items()):
            path = model_dir / fname
            if not path.is_file():
                raise ModelFileMismatch(f"{path}: listed in the manifest but missing")
            actual = sha256_file(path)
            if actual != digest.lower():
                raise ModelFileMismatch(
                    f"{path}: sha256 {actual} does not match the manifest ({digest}); "
                    "refusing to load a modified model file"
                )
        for path in sorted(model_dir.iterdir()):
            if path.is_file() and is_model_file(path.name) and path.name not in self.files:
                raise ModelFileMismatch(
                    f"{path}: would be loaded but is not listed in the manifest"
                )
        config_path = model_dir / "config.json"
        if "config.json" in self.files:
            on_disk = json.loads(config_path.read_text(encoding="utf-8"))
            if on_disk != dict(self.architecture):
                raise ModelFileMismatch(
                    f"{config_path}: differs from the manifest's architecture config"
                )


def build_manifest(model_dir: Path, name: str) -> Manifest:
    """Hash the model files in `model_dir` (a Hugging Face directory) into a Manifest."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelError(f"model directory {model_dir} does not exist")
    if not name:
        raise ModelError("a model needs a non-empty name")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelError(f"{model_dir} has no config.json: not a Hugging Face model directory")
    try:
        arch = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{config_path}: not valid JSON ({exc})") from exc
    files = {
        p.name: sha256_file(p)
        for p in sorted(model_dir.iterdir())
        if p.is_file() and is_model_file(p.name)
    }
    if not any(f.endswith(WEIGHTS_SUFFIX) for f in files):
        raise ModelError(f"{model_dir} has no *.safetensors weights (only safetensors load)")
    if not any(f in files for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise ModelError(f"{model_dir} has no tokenizer files")
    return Manifest(name=name, architecture=arch, files=files)


def manifest_path(path: Path) -> Path:
    path = Path(path)
    return path / MANIFEST_NAME if path.is_dir() else path


def load_manifest(path: Path) -> Manifest:
    """Read a manifest file, or `<dir>/quarry-manifest.json` when given a model directory."""
    given = Path(path)
    if not given.exists():
        raise ModelError(f"{given} does not exist (create a model there with `market model "
                         f"create --out {given}`, or point the setting at a model directory)")
    path = manifest_path(given)
    if not path.is_file():
        raise ModelError(
            f"no Quarry manifest at {path}; create a model with `market model create` or "
            "write one for existing weights with `market model manifest DIR --name NAME`"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: not valid JSON ({exc})") from exc
    return Manifest.from_dict(data, source=str(path))


def write_manifest(manifest: Manifest, path: Path) -> Path:
    """Write `manifest` (pretty, sorted) to a file or into a model directory; return the path."""
    path = manifest_path(path)
    text = json.dumps(manifest.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")
    return path
