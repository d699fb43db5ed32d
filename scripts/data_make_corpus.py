#!/usr/bin/env python3
"""Builds autocompress's corpora of real English text from Debian packages.

Source: the fortune-mod cookie files (/usr/share/games/fortunes, packages `fortunes` and
`fortunes-min`): about 15,000 short human-written English texts (quotations, literature,
poems, jokes, definitions), one document per cookie. Needs only python3 (stdlib) and the
Debian packages, so CI can rebuild it from scripts/setup.sh's package list.

  python3 scripts/data_make_corpus.py --output corpus.jsonl            # everything
  python3 scripts/data_make_corpus.py --output s.jsonl --every 10      # a 10% sample

Each line: {"text": ..., "source": "<cookie file>"}. Documents are in file order. That default
(--sources fortunes) is the demo/test corpus; its output is unchanged.

The larger prose corpus (`--sources all`, several million tokens; not built by CI):
  fortunes          the cookies above (fortune-mod; per-file licences, mostly quotations)
  python-doc        the Python 3.11 documentation, package python3.11-doc (HTML; PSF licence)
  debian-reference  Osamu Aoki's Debian Reference, package debian-reference-en (GPL-2+)
  debian-faq        the Debian GNU/Linux FAQ, package debian-faq (SPI, verbatim-copy licence)
HTML is turned into text with the stdlib html.parser: one document per section (h1/h2),
paragraphs separated by blank lines, code blocks (<pre>), navigation, tables of contents and
index pages left out. Documents that are mostly not letters, shorter than --min-chars, or
repeat an earlier document (case and whitespace folded) are dropped, and so are paragraphs of
80+ characters seen before (boilerplate). `source` is "<package>:<file>[#section]".
The split into train / calibration / eval is by document, at sampling time (docs/data.md);
deduplication keeps one copy of each document, so no text is in two splits twice over.
"""
import argparse
import hashlib
import html
import html.parser
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


# ---- HTML documentation -> sections of plain text ------------------------------------------
HTML_SOURCES = {
    # name: (Debian package, directory, files to leave out (regex on the relative path))
    "python-doc": ("python3.11-doc", "/usr/share/doc/python3.11/html",
                   r"^(_|genindex|py-modindex|search|contents|copyright|license|bugs|about)|whatsnew/changelog"),
    "debian-reference": ("debian-reference-en", "/usr/share/doc/debian-reference-en/docs", r"^index\."),
    "debian-faq": ("debian-faq", "/usr/share/doc/debian/FAQ", r"^index\."),
}
BLOCK = {"p", "div", "section", "li", "dd", "dt", "h1", "h2", "h3", "h4", "h5", "h6", "br", "tr", "td", "th",
         "blockquote", "table", "ul", "ol", "dl", "article", "body", "title", "caption", "figure"}
SKIP_TAGS = {"script", "style", "pre", "head", "nav", "noscript", "svg"}
SKIP_CLASSES = {"navheader", "navfooter", "toc", "sphinxsidebar", "related", "footer", "headerlink", "toctree-wrapper",
                "highlight", "breadcrumbs", "literallayout", "programlisting", "screen", "synopsis", "cmdsynopsis",
                "list-of-tables", "list-of-figures"}
VOID = {"br", "img", "hr", "meta", "link", "input", "wbr", "col", "area", "base", "source"}


class Sections(html.parser.HTMLParser):
    """Text of an HTML page cut at h1/h2 headings: [(heading, [paragraph, ...]), ...]. In a page
    with a Sphinx body (div role=main), only that body is read."""

    def __init__(self, sphinx):
        super().__init__(convert_charrefs=True)
        self.sphinx = sphinx
        self.stack = []  # (tag, skipping, in_body) per open element
        self.skip = 0
        self.body = 0 if sphinx else 1
        self.sections = [("", [])]
        self.buf = []
        self.heading = None

    def _flush(self):
        t = re.sub(r"\s+", " ", "".join(self.buf)).strip()
        self.buf = []
        if t:
            if self.heading is not None:
                self.heading.append(t)
            else:
                self.sections[-1][1].append(t)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        skip = tag in SKIP_TAGS or bool(classes & SKIP_CLASSES)
        body = self.sphinx and (a.get("role") == "main" or (tag == "div" and "body" in classes))
        if tag in BLOCK:
            self._flush()
        if tag in ("h1", "h2") and not self.skip and self.body:
            self.heading = []
        if tag not in VOID:
            self.stack.append((tag, skip, body))
            self.skip += skip
            self.body += body

    def handle_endtag(self, tag):
        if tag in VOID or not any(t == tag for t, _, _ in self.stack):
            return
        while self.stack:
            t, skip, body = self.stack.pop()
            self.skip -= skip
            self.body -= body
            if t in BLOCK:
                self._flush()
            if t in ("h1", "h2") and self.heading is not None:
                self.sections.append((" ".join(self.heading), []))
                self.heading = None
            if t == tag:
                break

    def handle_data(self, data):
        if not self.skip and self.body:
            self.buf.append(data)

    def close(self):
        super().close()
        self._flush()


def html_sections(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    p = Sections(sphinx='role="main"' in text)
    p.feed(text)
    p.close()
    for heading, paras in p.sections:
        paras = [x for x in paras if re.search(r"[A-Za-z]{2}", x)]
        if paras:
            yield heading, paras


def html_docs(name):
    package, root, leave_out = HTML_SOURCES[name]
    if not os.path.isdir(root):
        print(f"data_make_corpus: error: {root}: not found; install the Debian package {package} "
              f"(apt-get install {package})", file=sys.stderr)
        sys.exit(2)
    files = []
    for d, _, names in os.walk(root):
        for n in names:
            rel = os.path.relpath(os.path.join(d, n), root)
            if n.endswith(".html") and not re.search(leave_out, rel):
                files.append(rel)
    for rel in sorted(files):
        for i, (heading, paras) in enumerate(html_sections(os.path.join(root, rel))):
            text = "\n\n".join(([heading] if heading else []) + paras)
            yield text, f"{package}:{rel}#{i}"


def letters_ratio(text):
    chars = [c for c in text if not c.isspace()]
    return sum(c.isalpha() for c in chars) / max(1, len(chars))


def fortune_docs(d):
    if not os.path.isdir(d):
        sys.exit(f"{d}: not found; install the Debian packages fortunes and fortunes-min")
    names = sorted(n for n in os.listdir(d)
                   if not n.endswith((".dat", ".u8")) and n not in SKIP
                   and os.path.isfile(os.path.join(d, n)))
    for name in names:
        for doc in cookies(os.path.join(d, name)):
            yield doc, name


def prose_corpus(a, sources):
    """The --sources corpus: cleaned and deduplicated (see the module docstring)."""
    seen_docs, seen_paras = set(), set()
    stats = {}
    n_docs = 0
    tmp = a.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for src in sources:
            docs = fortune_docs(a.dir) if src == "fortunes" else html_docs(src)
            st = stats.setdefault(src, {"documents": 0, "bytes": 0, "duplicates": 0, "dropped": 0})
            for text, where in docs:
                if src != "fortunes":
                    paras = []
                    for para in text.split("\n\n"):
                        key = hashlib.sha1(re.sub(r"\s+", " ", para.lower()).strip().encode()).digest()
                        if len(para) >= 80 and key in seen_paras:
                            continue
                        seen_paras.add(key)
                        paras.append(para)
                    text = "\n\n".join(paras)
                    if len(text) < a.min_chars or letters_ratio(text) < 0.7:
                        st["dropped"] += 1
                        continue
                key = hashlib.sha1(re.sub(r"\s+", " ", text.lower()).strip().encode()).digest()
                if key in seen_docs:
                    st["duplicates"] += 1
                    continue
                seen_docs.add(key)
                if n_docs % a.every == 0:
                    out.write(json.dumps({"text": text, "source": where},
                                         ensure_ascii=False) + "\n")
                    st["documents"] += 1
                    st["bytes"] += len(text.encode("utf-8"))
                n_docs += 1
    os.replace(tmp, a.output)
    for src, st in stats.items():
        print(f"  {src}: {st['documents']} documents, {st['bytes']} bytes; dropped {st['duplicates']} duplicates, "
              f"{st['dropped']} short or not prose")
    print(f"{a.output}: {sum(s['documents'] for s in stats.values())} documents, "
          f"{sum(s['bytes'] for s in stats.values())} bytes of text, from {', '.join(sources)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", required=True)
    ap.add_argument("--every", type=int, default=1, help="keep one document in N")
    ap.add_argument("--dir", default=FORTUNE_DIR)
    ap.add_argument("--sources", default="fortunes",
                    help="comma list of fortunes, " + ", ".join(HTML_SOURCES) + ", or all (default: fortunes, "
                         "the demo/test corpus, byte for byte as before)")
    ap.add_argument("--min-chars", type=int, default=200, help="shortest documentation section kept (characters)")
    a = ap.parse_args()
    if a.every < 1:
        print("data_make_corpus: error: --every: must be >= 1", file=sys.stderr)
        sys.exit(2)
    sources = ["fortunes", *HTML_SOURCES] if a.sources == "all" else [s for s in a.sources.split(",") if s]
    for s in sources:
        if s != "fortunes" and s not in HTML_SOURCES:
            print(f"data_make_corpus: error: --sources: unknown source '{s}' (known: fortunes, "
                  f"{', '.join(HTML_SOURCES)}, all)", file=sys.stderr)
            sys.exit(2)
    if sources != ["fortunes"]:
        prose_corpus(a, sources)
        return
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
