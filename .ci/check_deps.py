"""Prove that `pip install 'quarry[vllm]'` resolves: pyproject's ranges and the vllm extra together.

A dry run against the package index (nothing is downloaded beyond metadata, nothing installed),
with `--ignore-installed` so the answer is what a fresh GPU machine would get, not this venv.
Prints one line with the versions chosen; exits non-zero with one line when it cannot resolve.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WATCHED = ("vllm", "torch", "transformers", "tokenizers", "fastapi", "pydantic")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extra", nargs="?", default="vllm", help="the extra to resolve")
    parser.add_argument("--timeout", type=float, default=420.0,
                        help="seconds before giving up (default 420; 2 to 3.5 min measured)")
    args = parser.parse_args()
    extra = args.extra
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--quiet", "--report", str(report), f".[{extra}]"]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"check-deps: resolving '.[{extra}]' took over {args.timeout:.0f} s "
                  "(is the package index slow or unreachable?)", file=sys.stderr)
            return 1
        if proc.returncode != 0:
            reason = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")]
            print(f"check-deps: '.[{extra}]' does not resolve: "
                  f"{' '.join(reason) or proc.stderr.strip()[-300:]}", file=sys.stderr)
            return 1
        chosen = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                  for item in json.loads(report.read_text())["install"]}
    if extra not in chosen:
        print(f"check-deps: the resolution of '.[{extra}]' has no {extra}", file=sys.stderr)
        return 1
    versions = ", ".join(f"{n} {chosen[n]}" for n in WATCHED if n in chosen)
    print(f"check-deps: '.[{extra}]' resolves ({versions}) in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
