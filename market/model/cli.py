"""`market model create|id|manifest`: make the embedded model, and name any model by its modelId.

Cheap to import: numpy, safetensors, transformers and eth_utils load inside the handlers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from market.model.archs import SUPPORTED_MODEL_TYPES
from market.model.create import (
    DEFAULT_HIDDEN,
    DEFAULT_LAYERS,
    DEFAULT_MAX_POSITIONS,
    DEFAULT_NAME,
    DEFAULT_SEED,
)
from market.model.tokenizer import DEFAULT_VOCAB_SIZE


def add_commands(subparsers: Any) -> None:
    model = subparsers.add_parser(
        "model",
        help="create the embedded tiny model; print a model directory's modelId",
        description="Model tools. A modelId is keccak256 of the canonical JSON manifest "
        "(name, architecture config, sha256 of every weights and tokenizer file).",
    )
    sub = model.add_subparsers(dest="model_command", metavar="ACTION")

    create = sub.add_parser(
        "create",
        help="write a deterministic random model (same arguments, same bytes)",
        description="Write a tiny model of a served architecture (Llama by default) with "
        "random weights from a seed, the project's byte-level BPE tokenizer and "
        "quarry-manifest.json.",
    )
    create.add_argument("--arch", default="llama", choices=SUPPORTED_MODEL_TYPES,
                        help="architecture (llama); each keeps its real models' traits: "
                        "tied embeddings, biases, q/k norms, sliding windows, soft caps")
    create.add_argument("--out", required=True, type=Path,
                        help="output directory (new, empty, or holding this same model)")
    create.add_argument("--name", default=DEFAULT_NAME, help=f"model name ({DEFAULT_NAME})")
    create.add_argument("--layers", type=int, default=DEFAULT_LAYERS,
                        help=f"decoder layers ({DEFAULT_LAYERS})")
    create.add_argument("--hidden", type=int, default=DEFAULT_HIDDEN,
                        help=f"hidden size ({DEFAULT_HIDDEN})")
    create.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help=f"weights seed ({DEFAULT_SEED})")
    create.add_argument("--heads", type=int, default=None, help="attention heads (hidden/32)")
    create.add_argument("--kv-heads", type=int, default=None, help="key/value heads (heads/2)")
    create.add_argument("--intermediate", type=int, default=None, help="MLP size (3*hidden)")
    create.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                        help=f"tokenizer vocabulary cap ({DEFAULT_VOCAB_SIZE})")
    create.add_argument("--max-positions", type=int, default=DEFAULT_MAX_POSITIONS,
                        help=f"context length ({DEFAULT_MAX_POSITIONS})")
    create.add_argument("--force", action="store_true",
                        help="replace another model already in --out")
    create.add_argument("--json", action="store_true", help="print the result as JSON")
    create.set_defaults(func=_create)

    ident = sub.add_parser(
        "id",
        help="verify a model directory against its manifest and print its modelId",
    )
    ident.add_argument("dir", type=Path, help="model directory holding quarry-manifest.json")
    ident.add_argument("--json", action="store_true", help="print the result as JSON")
    ident.set_defaults(func=_id)

    manifest = sub.add_parser(
        "manifest",
        help="write quarry-manifest.json for existing Hugging Face weights",
        description="Hash config, safetensors weights and tokenizer files of a local Hugging "
        "Face model directory into quarry-manifest.json and print the modelId.",
    )
    manifest.add_argument("dir", type=Path, help="Hugging Face model directory")
    manifest.add_argument("--name", required=True, help="model name recorded in the manifest")
    manifest.add_argument("--force", action="store_true", help="replace an existing manifest")
    manifest.set_defaults(func=_manifest)

    model.set_defaults(func=lambda args: (model.print_help(), 2)[1])


def _report(manifest: Any, model_dir: Path, as_json: bool) -> None:
    if as_json:
        print(json.dumps({
            "modelId": manifest.model_id_hex,
            "name": manifest.name,
            "dir": str(model_dir),
            "files": dict(sorted(manifest.files.items())),
        }, indent=2))
        return
    print(f"modelId {manifest.model_id_hex}")
    print(f"name    {manifest.name}")
    print(f"dir     {model_dir}")
    for fname, digest in sorted(manifest.files.items()):
        print(f"  {fname:<26} sha256 {digest}")


def _create(args: argparse.Namespace) -> int:
    from market.model.create import create_model

    manifest = create_model(
        args.out,
        name=args.name,
        layers=args.layers,
        hidden=args.hidden,
        seed=args.seed,
        heads=args.heads,
        kv_heads=args.kv_heads,
        intermediate=args.intermediate,
        vocab_size=args.vocab_size,
        max_positions=args.max_positions,
        replace=args.force,
        arch=args.arch,
    )
    _report(manifest, args.out, args.json)
    return 0


def _id(args: argparse.Namespace) -> int:
    from market.model.manifest import load_manifest

    manifest = load_manifest(args.dir)
    manifest.verify(args.dir)
    if args.json:
        _report(manifest, args.dir, True)
    else:
        print(manifest.model_id_hex)
    return 0


def _manifest(args: argparse.Namespace) -> int:
    from market.model.manifest import ModelError, build_manifest, manifest_path, write_manifest

    target = manifest_path(args.dir)
    if target.exists() and not args.force:
        raise ModelError(f"{target} already exists; pass --force to replace it")
    manifest = build_manifest(args.dir, args.name)
    write_manifest(manifest, args.dir)
    _report(manifest, args.dir, False)
    return 0
