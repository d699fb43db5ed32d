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
  man-pages         the Linux man-pages project's sections 2, 3, 4, 5, 7 (packages manpages and
                    manpages-dev; per-page licences in /usr/share/doc/manpages/copyright: mostly
                    the Linux-man-pages copyleft, GPL-2+, BSD); roff turned into text here, with
                    SYNOPSIS, SEE ALSO, VERSIONS, ATTRIBUTES, LIBRARY, COLOPHON and no-fill
                    blocks (code, tables) left out, one document per page
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


# ---- manual pages (roff) -> plain text ---------------------------------------------------
MAN_SOURCES = {"man-pages": (("manpages", "manpages-dev"), ("man2", "man3", "man4", "man5", "man7"))}
ROFF_GLYPHS = {"em": "\u2014", "en": "\u2013", "aq": "'", "dq": '"', "lq": "\u201c", "rq": "\u201d", "oq": "\u2018",
               "cq": "\u2019", "bu": "\u2022", "co": "\u00a9", "rg": "\u00ae", "ti": "~", "ha": "^", "mi": "-",
               "hy": "-", "ga": "`", "ul": "_", "rs": "\\", "+-": "\u00b1", "mu": "\u00d7", "<=": "\u2264",
               ">=": "\u2265", "->": "\u2192", "tm": "\u2122", "de": "\u00b0", "bv": "|", "sl": "/", "sq": "\u25a1"}
ROFF_FONT_MACROS = {"B", "I", "SM", "SB"}          # arguments joined with spaces
ROFF_ALT_MACROS = {"BR", "RB", "IR", "RI", "BI", "IB"}  # arguments joined without spaces
ROFF_BREAKS = {"PP", "LP", "P", "TP", "IP", "HP", "sp", "br", "TQ", "RS", "RE", "in", "ti", "bp"}
ROFF_NOFILL = {"nf": "fi", "EX": "EE", "TS": "TE", "EQ": "EN", "de": "..", "ig": ".."}
# Sections that are not running prose, and the man-pages project's colophon.
MAN_SKIP_SECTIONS = {"SYNOPSIS", "SEE ALSO", "COLOPHON", "VERSIONS", "ATTRIBUTES", "LIBRARY"}


def roff_unescape(t):
    t = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", t)               # fonts
    t = re.sub(r"\\\((..)", lambda m: ROFF_GLYPHS.get(m.group(1), ""), t)
    t = re.sub(r"\\\[([^\]]*)\]", lambda m: ROFF_GLYPHS.get(m.group(1), ""), t)
    t = re.sub(r"\\\*(\[[^\]]*\]|\(..|.)", "", t)             # strings
    t = re.sub(r"\\s[-+]?\d+", "", t)                             # sizes
    t = re.sub(r"\\[nk](\[[^\]]*\]|\(..|.)", "", t)             # registers, marks
    t = re.sub(r"\\[hvwoDlLxXZbN]'[^']*'", "", t)
    t = t.replace("\\-", "-").replace("\\e", "\\").replace("\\ ", " ").replace("\\~", " ")
    t = re.sub(r"\\[&%|^c:)/,0tdu!]", "", t)
    t = re.sub(r"\\(.)", r"\1", t)
    return t


def roff_args(line):
    """The arguments of a macro line (double quotes group words)."""
    return [a[1:-1] if a.startswith('"') else a for a in re.findall(r'"[^"]*"|\S+', line)]


def man_text(path):
    """(title, [(section, [paragraph, ...]), ...]) of one roff manual page, or None for a link."""
    import gzip
    raw = (gzip.open if path.endswith(".gz") else open)(path, "rb").read().decode("utf-8", errors="replace")
    lines = raw.splitlines()
    if any(l.startswith(".so ") for l in lines[:3]):
        return None
    sections, paras, buf, section, nofill = [], [], [], "", None
    title = os.path.basename(path).split(".gz")[0]

    def flush():
        t = re.sub(r"\s+", " ", " ".join(buf)).strip()
        buf.clear()
        if t:
            paras.append(t)

    def end_section():
        flush()
        if paras and section.upper() not in MAN_SKIP_SECTIONS:
            sections.append((section, paras.copy()))
        paras.clear()

    for line in lines:
        if nofill:
            if re.match(r"^[.']\s*" + re.escape(nofill) + r"\b", line) or (nofill == ".." and line.startswith("..")):
                nofill = None
            continue
        if line.startswith((".\\\"", "'\\\"", '\\"')):
            continue
        if line.startswith((".", "'")):
            m = re.match(r"^[.']\s*(\S+)\s*(.*)$", line)
            if not m:
                continue
            mac, rest = m.group(1), m.group(2)
            if mac in ROFF_NOFILL:
                flush()
                nofill = ROFF_NOFILL[mac]
            elif mac in ("SH", "SS"):
                if mac == "SH":
                    end_section()
                    section = roff_unescape(" ".join(roff_args(rest))).strip()
                else:
                    flush()
            elif mac in ROFF_BREAKS:
                flush()
            elif mac in ROFF_FONT_MACROS:
                buf.append(roff_unescape(" ".join(roff_args(rest))))
            elif mac in ROFF_ALT_MACROS:
                buf.append(roff_unescape("".join(roff_args(rest))))
            elif mac in ("UR", "MT"):
                pass
            continue
        buf.append(roff_unescape(line))
    end_section()
    return title, sections


def man_docs(name):
    packages, dirs = MAN_SOURCES[name]
    files = []
    for pkg in packages:
        lst = f"/var/lib/dpkg/info/{pkg}.list"
        if not os.path.isfile(lst):
            print(f"data_make_corpus: error: {lst}: not found; install the Debian package {pkg} "
                  f"(apt-get install {pkg})", file=sys.stderr)
            sys.exit(2)
        for p in open(lst).read().split():
            parts = p.split("/")
            if len(parts) == 6 and parts[:4] == ["", "usr", "share", "man"] and parts[4] in dirs and os.path.isfile(p) \
                    and not os.path.islink(p):
                files.append((pkg, p))
    for pkg, path in sorted(files, key=lambda x: x[1]):
        r = man_text(path)
        if r is None:
            continue
        title, sections = r
        paras = []
        for sec, ps in sections:
            paras += ([sec.capitalize()] if sec and sec != "NAME" else []) + ps
        if paras:
            yield "\n\n".join(paras), f"{pkg}:{os.path.relpath(path, '/usr/share/man')}"


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
            docs = fortune_docs(a.dir) if src == "fortunes" else man_docs(src) if src in MAN_SOURCES else html_docs(src)
            st = stats.setdefault(src, {"documents": 0, "bytes": 0, "duplicates": 0, "dropped": 0})
            for text, where in docs:
                # Whole-document duplicates first, on the text as found, so that a repeated page is
                # dropped whole rather than kept as the fragments the paragraph filter leaves.
                key = hashlib.sha1(re.sub(r"\s+", " ", text.lower()).strip().encode()).digest()
                if key in seen_docs:
                    st["duplicates"] += 1
                    continue
                seen_docs.add(key)
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
                    help="comma list of fortunes, " + ", ".join([*HTML_SOURCES, *MAN_SOURCES]) + ", or all (default: fortunes, "
                         "the demo/test corpus, byte for byte as before)")
    ap.add_argument("--min-chars", type=int, default=200, help="shortest documentation section kept (characters)")
    a = ap.parse_args()
    if a.every < 1:
        print("data_make_corpus: error: --every: must be >= 1", file=sys.stderr)
        sys.exit(2)
    known = ["fortunes", *HTML_SOURCES, *MAN_SOURCES]
    sources = known if a.sources == "all" else [s for s in a.sources.split(",") if s]
    for s in sources:
        if s not in known:
            print(f"data_make_corpus: error: --sources: unknown source '{s}' (known: "
                  f"{', '.join(known)}, all)", file=sys.stderr)
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
