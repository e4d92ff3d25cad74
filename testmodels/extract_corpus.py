"""Extract the training text of the trained test model from Python's own documentation.

The source is Debian's `python3.11-doc` package (3.11.2-6+deb12u9): the reStructuredText
sources of the Python tutorial and language reference under
/usr/share/doc/python3.11/html/_sources/{tutorial,reference}. Markup that is not prose
(directives, labels, heading underlines, role names) is dropped; prose and code examples
stay. The result ships gzipped in testmodels/corpus/ (with the PSF licence the text is
under), so training needs nothing outside the repository:

    apt-get download python3.11-doc && dpkg-deb -x python3.11-doc_*.deb /tmp/pydoc
    python testmodels/extract_corpus.py /tmp/pydoc/usr/share/doc/python3.11/html/_sources
"""

from __future__ import annotations

import argparse
import gzip
import re
from pathlib import Path

OUT = Path(__file__).resolve().parent / "corpus" / "python-3.11-docs.txt.gz"
SECTIONS = ("tutorial", "reference")
UNDERLINE = re.compile(r"^\s*([=\-*~^+#`'\".])\1{2,}\s*$")
ROLE = re.compile(r":[a-z:]+:`!?~?([^`<]*?)(?:\s*<[^>]*>)?`")
LITERAL = re.compile(r"``([^`]*)``")


def clean(text: str) -> str:
    """Prose and code of one reST file, without the markup around them."""
    out: list[str] = []
    skipping = False
    for line in text.splitlines():
        if line.startswith(".. "):
            skipping = True  # a directive, label or comment, with its indented options
            continue
        if skipping and (line.startswith("   ") or not line.strip()):
            if line.strip().startswith(":") or not line.strip():
                continue
        skipping = False
        if UNDERLINE.match(line):
            continue
        line = LITERAL.sub(r"\1", ROLE.sub(r"\1", line)).rstrip()
        out.append(line.replace("::", ":") if line.endswith("::") else line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", type=Path, help="the html/_sources directory")
    args = parser.parse_args()
    parts = [clean(path.read_text(encoding="utf-8"))
             for section in SECTIONS
             for path in sorted((args.sources / section).glob("*.rst.txt"))]
    data = "\n".join(parts).encode("utf-8")
    with OUT.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                              filename="") as gz:
        gz.write(data)
    print(f"{len(data)} bytes of text -> {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
