#!/usr/bin/env python3
"""Writes src/tokenizer/bert_unicode_tables.inc: what BERT's text normalization does to each
code point, as compact tables for src/tokenizer/bert_normalizer.cpp.

The reference is Hugging Face `tokenizers` with BertNormalizer(clean_text=True,
handle_chinese_chars=True, strip_accents=None, lowercase=True) and BertPreTokenizer. Its
steps, per code point: drop NUL, U+FFFD and "other" characters (Cc, Cf, Co; tab, newline and
carriage return are whitespace), turn whitespace into a space, put spaces around CJK
ideographs, NFD, drop nonspacing marks (Mn), lowercase (the full mapping, one code point at
a time); then split words at spaces and isolate punctuation (ASCII punctuation and P*).

The tables are read off the reference itself, one code point at a time, because it mixes
Unicode versions: its category tests (other, Mn, P*) use Unicode 8.0 tables, while its NFD
and lowercase follow the newer Unicode of its Rust toolchain. No single unicodedata module
agrees with it; the script counts, per category, the code points where Python's own
unicodedata would have given a different answer, and checks its assumptions (every step is
per code point, Hangul syllables decompose algorithmically, mapped text holds no spaces).

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers==0.23.3
    /tmp/tokvenv/bin/python scripts/gen_unicode_tables.py src/tokenizer/bert_unicode_tables.inc

The output is deterministic for a given tokenizers version.
"""
import collections
import sys
import unicodedata

import tokenizers
from tokenizers import normalizers, pre_tokenizers

# Classes, in the order the C++ tests them (bert_normalizer.cpp's CpClass).
DEFAULT, DROP, SPACE, PUNCT, CJK, HANGUL, MAPPED = range(7)
CLASS_NAMES = ["kDefault", "kDrop", "kSpace", "kPunct", "kCjk", "kHangul", "kMapped"]

# The ideograph blocks BertNormalizer surrounds with spaces (its own list, not a property).
CJK_RANGES = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
              (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3


def is_cjk(cp):
    return any(a <= cp <= b for a, b in CJK_RANGES)


def hangul_nfd(cp):
    s = cp - HANGUL_FIRST
    out = [0x1100 + s // 588, 0x1161 + (s % 588) // 28]
    if s % 28:
        out.append(0x11A7 + s % 28)
    return "".join(chr(c) for c in out)


def unicodedata_guess(cp):
    """What the steps give with Python's unicodedata alone (for the cross-check)."""
    c = chr(cp)
    cat = unicodedata.category(c)
    if cp in (0, 0xFFFD) or (cat in ("Cc", "Cf", "Co") and c not in "\t\n\r"):
        return ""
    if c.isspace():
        return " "
    s = unicodedata.normalize("NFD", c)
    s = "".join(ch for ch in s if unicodedata.category(ch) != "Mn")
    s = "".join(ch.lower() for ch in s)
    return " " + s + " " if is_cjk(cp) else s


def probe():
    norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                      strip_accents=None, lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    cls = {}
    mapping = {}
    disagree = collections.Counter()
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        m = norm.normalize_str(c)
        if m != unicodedata_guess(cp):
            disagree[unicodedata.category(c)] += 1
        # Every step works on one code point at a time, so a character's output does not
        # depend on its neighbours (NFD's reordering of marks aside: see the C++ header).
        assert norm.normalize_str("x" + c + "y") == "x" + m + "y", hex(cp)
        if m == "":
            cls[cp] = DROP
            continue
        if m == " ":
            cls[cp] = SPACE
            continue
        if is_cjk(cp):
            assert m[0] == " " and m[-1] == " " and " " not in m[1:-1], hex(cp)
            cls[cp] = CJK
            if m[1:-1] != c:
                mapping[cp] = m[1:-1]
            continue
        assert " " not in m, hex(cp)
        if HANGUL_FIRST <= cp <= HANGUL_LAST:
            assert m == hangul_nfd(cp), hex(cp)
            cls[cp] = HANGUL
            continue
        if m != c:
            cls[cp] = MAPPED
            mapping[cp] = m
            continue
        pieces = pre.pre_tokenize_str("x" + c + "y")
        if len(pieces) == 3 and pieces[1][0] == c:
            cls[cp] = PUNCT
        else:
            assert len(pieces) == 1, hex(cp)
    return cls, mapping, disagree


def check_outputs(cls, mapping):
    """Mapped text is final: no spaces, nothing dropped or mapped again; CJK stays CJK."""
    for cp, m in mapping.items():
        for ch in m:
            k = cls.get(ord(ch), DEFAULT)
            allowed = (DEFAULT, CJK) if cls[cp] == CJK else (DEFAULT, PUNCT)
            assert k in allowed, (hex(cp), hex(ord(ch)), k)
        if len(m) > 1:
            assert all(cls.get(ord(ch), DEFAULT) == DEFAULT for ch in m), hex(cp)


def class_ranges(cls):
    ranges = []
    for cp in sorted(cls):
        k = cls[cp]
        if ranges and ranges[-1][1] == cp - 1 and ranges[-1][2] == k:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp, k])
    return ranges


def single_runs(singles, taken):
    """Runs of code points first, first + stride, ... each mapping to itself + delta. A run
    covers [first, last] alone: no other mapped code point falls inside it."""
    runs = []
    cps = sorted(singles)
    i = 0
    while i < len(cps):
        first = cps[i]
        delta = singles[first] - first
        stride = 1
        nxt = first + 1
        if not (nxt in singles and singles[nxt] - nxt == delta):
            nxt2 = first + 2
            if nxt2 in singles and singles[nxt2] - nxt2 == delta and nxt not in taken:
                stride = 2
        count = 1
        cur = first
        while count < 0xFFFF:
            n = cur + stride
            if not (n in singles and singles[n] - n == delta):
                break
            if stride == 2 and (cur + 1) in taken:
                break
            cur = n
            count += 1
        runs.append((first, count, stride, delta))
        i += 1
        while i < len(cps) and cps[i] <= cur:
            i += 1
    return runs


def c_bytes(b):
    out = []
    for x in b:
        out.append("\\x%02x" % x)
    return "".join(out)



def table(lines, decl, items, per_row):
    """A C++ array initializer: `decl`, the items `per_row` to a line, the closing brace."""
    lines.append(decl)
    for i in range(0, len(items), per_row):
        lines.append("    " + ", ".join(items[i:i + per_row]) + ",")
    lines.append("};")

def write(path, cls, mapping, disagree):
    ranges = class_ranges(cls)
    singles = {cp: ord(m) for cp, m in mapping.items() if len(m) == 1}
    multis = {cp: m for cp, m in mapping.items() if len(m) > 1}
    runs = single_runs(singles, set(mapping))
    # Every single mapping is covered by exactly one run.
    covered = {}
    for first, count, stride, delta in runs:
        for k in range(count):
            covered[first + k * stride] = first + k * stride + delta
    assert covered == singles

    pool = bytearray()
    seqs = []
    for cp in sorted(multis):
        b = multis[cp].encode("utf-8")
        assert len(b) < 256 and len(pool) < 65536
        seqs.append((cp, len(pool), len(b), len(multis[cp])))
        pool += b

    lines = []
    lines.append("// Generated by scripts/gen_unicode_tables.py from Hugging Face tokenizers %s "
                 "(categories: Unicode 8.0;" % tokenizers.__version__)
    lines.append("// NFD and lowercase: the Unicode of its Rust toolchain). Python %s's "
                 "unicodedata is Unicode %s." % (sys.version.split()[0], unicodedata.unidata_version))
    lines.append("// Do not edit; rerun the script. Included by bert_normalizer.cpp only.")
    lines.append("// clang-format off")
    lines.append("")
    lines.append("// Code point classes as ranges, sorted and disjoint; absent: kDefault.")
    table(lines, "inline constexpr CpRange kCpRanges[] = {",
          ["{0x%X, 0x%X, %s}" % (a, b, CLASS_NAMES[k]) for a, b, k in ranges], 4)
    lines.append("")
    lines.append("// One-code-point mappings: first, first + stride, ... (count of them) -> cp + delta.")
    table(lines, "inline constexpr CpRun kCpRuns[] = {",
          ["{0x%X, %d, %d, %d}" % run for run in runs], 5)
    lines.append("")
    lines.append("// Longer mappings: code point -> UTF-8 bytes at kCpSeqBytes[offset, offset + n_bytes).")
    table(lines, "inline constexpr CpSeq kCpSeqs[] = {",
          ["{0x%X, %d, %d, %d}" % seq for seq in seqs], 5)
    lines.append("inline constexpr char kCpSeqBytes[] =")
    for i in range(0, len(pool), 24):
        lines.append('    "%s"' % c_bytes(pool[i:i + 24]))
    lines.append("    ;")
    lines.append("// clang-format on")
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")

    print("%d class ranges, %d runs for %d one-code-point mappings, %d longer mappings (%d bytes)"
          % (len(ranges), len(runs), len(singles), len(seqs), len(pool)), file=sys.stderr)
    print("code points where unicodedata %s alone would differ, by its category: %s"
          % (unicodedata.unidata_version, dict(sorted(disagree.items()))), file=sys.stderr)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_unicode_tables.py OUTPUT.inc")
    cls, mapping, disagree = probe()
    check_outputs(cls, mapping)
    write(sys.argv[1], cls, mapping, disagree)


if __name__ == "__main__":
    main()
