"""Model manifests, the embedded tiny model, and loading from local directories.

- `create.create_model`: the deterministic tiny model, Llama or another served architecture
  (same arguments, same bytes, same modelId).
- `archs`: the architectures the engines serve, and what a split model must repeat of each.
- `manifest`: `Manifest` (name, architecture, sha256 per file) and `modelId`.
- `loading.load_model`: verify files against the manifest, then load with transformers.
- `prompts`: text and chat prompts (OpenAI request bodies) to token ids.

Importing this package is cheap; torch and transformers load only inside `load_model` and
`create_model`.
"""

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

__all__ = [
    "MANIFEST_NAME",
    "Manifest",
    "ModelError",
    "ModelFileMismatch",
    "build_manifest",
    "create_model",
    "load_manifest",
    "load_model",
    "write_manifest",
]
