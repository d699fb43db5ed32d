#!/usr/bin/env python3
"""Builds autocompress's demo/test corpus from Debian's `fortunes` packages.

Source: the fortune-mod cookie files (/usr/share/games/fortunes, packages `fortunes` and
`fortunes-min`): about 15,000 short human-written English texts (quotations, literature,
poems, jokes, definitions), one document per cookie. Needs only python3 (stdlib) and the
Debian packages, so CI can rebuild it from scripts/setup.sh's package list.

  python3 scripts/data_make_corpus.py --output corpus.jsonl            # everything
  python3 scripts/data_make_corpus.py --output s.jsonl --every 10      # a 10% sample

Each line: {"text": ..., "source": "<cookie file>"}. Documents are in file order.
"""
import argparse
import json
import os
import re
import sys

FORTUNE_DIR = "/usr/share/games/fortunes"
# ascii-art is pictures, not prose; the rest is human-written English text.
SKIP = {"ascii-art"}


def cookies(path):
    with open(path, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8", errors="replace")
    text = re.sub(r".\x08", "", text)  # overstrike (x BS x) used for bold in a few cookies
    for chunk in re.split(r"^%\s*$", text, flags=re.M):
        chunk = chunk.strip("\n")
        if chunk.strip():
            yield chunk


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", required=True)
    ap.add_argument("--every", type=int, default=1, help="keep one document in N")
    ap.add_argument("--dir", default=FORTUNE_DIR)
    a = ap.parse_args()
    if not os.path.isdir(a.dir):
        sys.exit(f"{a.dir}: not found; install the Debian packages fortunes and fortunes-min")
    names = sorted(n for n in os.listdir(a.dir)
                   if not n.endswith((".dat", ".u8")) and n not in SKIP
                   and os.path.isfile(os.path.join(a.dir, n)))
    n_docs = n_kept = n_bytes = 0
    tmp = a.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for name in names:
            for doc in cookies(os.path.join(a.dir, name)):
                if n_docs % a.every == 0:
                    out.write(json.dumps({"text": doc, "source": name}, ensure_ascii=False) + "\n")
                    n_kept += 1
                    n_bytes += len(doc.encode("utf-8"))
                n_docs += 1
    os.replace(tmp, a.output)
    print(f"{a.output}: {n_kept} documents, {n_bytes} bytes of text, from {len(names)} cookie files")


if __name__ == "__main__":
    main()
