#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/minilm_wordpiece.json: WordPiece token ids from Hugging
Face `tokenizers` (the reference) for all-MiniLM-L6-v2's tokenizer.json, which metro's
"bert" tokenizer must equal (tests/convert/hf_tokenizer_test.cpp). Produced with:

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers==0.23.3
    make model-minilm
    /tmp/tokvenv/bin/python scripts/make_wordpiece_fixture.py \\
        models/all-MiniLM-L6-v2/tokenizer.json tests/fixtures/tokenizer/minilm_wordpiece.json

Each case holds the text, `ids` = encode(text) with the special tokens the post-processor
adds ([CLS] ... [SEP]) and `normalized` = the normalizer's output alone. The file's padding
and truncation settings (128 tokens) are turned off: metro neither pads nor truncates.
The script is deterministic: rerunning it rewrites an identical file.
"""
import json
import sys

import tokenizers

LONG_PARAGRAPH = (
    "Sentence embeddings map a whole sentence to one vector, so that sentences with similar "
    "meanings end up close together. The model reads at most 512 tokens; the tokenizer file "
    "asks for padding and truncation to 128, which a server must not apply behind the "
    "caller's back. This paragraph is long enough to pass 128 tokens once it is split into "
    "word pieces, and it repeats itself to be sure: sentence embeddings map a whole sentence "
    "to one vector, so that sentences with similar meanings end up close together, and "
    "cosine similarity between two vectors measures how alike two sentences are.")

TEXTS = [
    # Plain English, capitals, repeated words (the word cache).
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "HELLO WORLD, THIS IS LOUD",
    "McDonald's iPhone eBay YouTube",
    "the the the the the",
    LONG_PARAGRAPH,
    # Punctuation runs and symbols.
    "Hello, World! How are you?",
    "...!!!???",
    "a...b--c==d",
    "(parenthesized) [bracketed] {braced} <angled>",
    "e-mail: someone@example.com",
    "https://example.com/path?q=1&r=2#frag",
    "C++ is fun; Python's fun too.",
    "#hashtag @mention $100 ^caret ~tilde `backtick` |pipe| \\backslash",
    "\u00abquoted\u00bb \u201edouble\u201c \u2018single\u2019 \u201ccurly\u201d",
    "a\u2014b\u2013c \u2026 \u00bfQu\u00e9? \u00a1Hola!",
    "don't won't it's y'all",
    "\u00a7 \u00b6 \u2020 \u2022 \u203b \u3001\u3002\u300c\u300d",
    "\u20ac100 \u00a35 \u00a5300 \u00b1 \u00d7 \u00f7 \u2264 \u221e",
    # Numbers.
    "12345 3.14159 1,000,000 2024-01-01",
    "0x1F 1e-9 100% 7/8",
    "\u00bd \u00bc \u2153 \u00b2 \u2075 \u2160\u2161 \u2167",
    # Accents and other Latin.
    "caf\u00e9",
    "na\u00efve",
    "\u00c5ngstr\u00f6m \u212bngstr\u00f6m",
    "r\u00e9sum\u00e9 fa\u00e7ade jalape\u00f1o",
    "Cr\u00e8me Br\u00fbl\u00e9e S\u00e3o Paulo",
    "\u00c6r\u00f8sk\u00f8bing \u0152uvre stra\u00dfe STRASSE",
    "\u0141\u00f3d\u017a \u017b\u00f3\u0142\u0107 \u0160koda \u010ce\u0161tina",
    "Vi\u1ec7t Nam ti\u1ebfng Vi\u1ec7t",
    "\u01c5 \u01c4 \u01c6 titlecase digraphs",
    "\ufb01 \ufb00 ligatures",
    # Greek, Cyrillic, other scripts.
    "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5",
    "\u03a3\u03af\u03c3\u03c5\u03c6\u03bf\u03c2 \u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0401\u0436\u0438\u043a \u0439\u043e\u0433\u0443\u0440\u0442",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
    "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0 \u0532\u0561\u0580\u0565\u0582",
    # CJK, kana, hangul.
    "\u6211\u60f3\u5728apple\u5de5\u4f5c",
    "\u4e2d\u6587\u5b57\u7b26\u6d4b\u8bd5\uff0c\u8c22\u8c22\uff01",
    "\u6f22\u5b57\u304b\u306a\u4ea4\u3058\u308a\u6587",
    "\u3072\u3089\u304c\u306a \u30ab\u30bf\u30ab\u30ca \uff76\uff80\uff76\uff85",
    "\u30b3\u30fc\u30d2\u30fc\u3092\u304f\u3060\u3055\u3044",
    "\uc548\ub155\ud558\uc138\uc694 \uc138\uacc4",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8 \u1100\u1161\u11a8",
    "\U00020000\U00020001 \U0002b820 \U0002b920 \ufa0e \uf900 \u2f00",
    "abc\u4e2ddef",
    # Emoji.
    "I love \U0001F917 and \U0001F355!",
    "\U0001F468\u200d\U0001F469\u200d\U0001F467 family",
    "\U0001F970 \U0001F929 newer emoji",
    "\U0001F600\U0001F603\U0001F604 \u2764\ufe0f \U0001F44D\U0001F3FD",
    # Control and format characters.
    "a\u0000b",
    "a\u0007b\u001bc",
    "a\u200bb\u200dc\u2060d",
    "soft\u00adhyphen",
    "\ufeffbyte order mark",
    "a\ufffdb",
    "a\u000bb\u000cc",
    "a\u0085b",
    "private \ue000use\U000F0000",
    "a\u0890b \U000110cd",
    # Whitespace.
    "tab\tseparated\tvalues",
    "line1\nline2\r\nline3\rline4",
    "   leading and trailing   ",
    "a\u00a0b\u3000c\u2003d\u2028e\u202ff",
    "a\u1680b\u180ec",
    # Long words.
    "a" * 100,
    "a" * 101,
    "supercalifragilisticexpialidocious",
    "x" * 150 + " ok",
    "\u00e9" * 100,
    "\u00e9" * 101,
    "pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    # Words partly out of the vocabulary.
    "unaffable tokenization xyzzyq",
    "qwertyuiopasdfghjklzxcvbnm",
    "\u24d0\u24d1\u24d2 \u210c\U0001d522\U0001d529\U0001d529\U0001d52c",
    "\uff21\uff22\uff23 \uff46\uff55\uff4c\uff4c \uff57\uff49\uff44\uff54\uff48 \uff11\uff12\uff13\uff01",
    # Special-token text.
    "[CLS] hello [SEP]",
    "[cls] lowercase is not special",
    "x[MASK]y",
    "[UNK]",
    "[PAD][PAD]",
    "[CLS][SEP]",
    "[ CLS ] [CLS [SEP",
    "[MASK] is a [MASK] word",
    # U+2581, the GGUF spelling's word-start mark, in the text itself.
    "hello\u2581world \u2581x \u2581",
    # Empty and whitespace only.
    "",
    "   ",
    "\n\n\t \r",
    # Combining marks.
    "e\u0301",
    "a\u0300\u0316 n\u0303o",
    "Z\u0351\u036b\u0343a\u0352l\u0310g\u0344o",
    "\u0301 alone",
    "a\u08d4b a\u08e3b",
    "A\u1734B",
    # Dotted and dotless i.
    "\u0130stanbul D\u0130YARBAKIR",
    "\u0131\u015f\u0131k I\u0130",
    "\u212a\u212b \u2126",
    # Mixed.
    "The caf\u00e9 \u6771\u4eac served 3 cr\u00eapes \U0001F950 for \u20ac12.50!",
]


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: make_wordpiece_fixture.py TOKENIZER_JSON OUTPUT_JSON")
    tok = tokenizers.Tokenizer.from_file(sys.argv[1])
    tok.no_padding()
    tok.no_truncation()
    cases = []
    for text in TEXTS:
        enc = tok.encode(text)
        cases.append({"text": text, "ids": enc.ids,
                      "normalized": tok.normalizer.normalize_str(text)})
    out = {
        "produced_by": "scripts/make_wordpiece_fixture.py models/all-MiniLM-L6-v2/tokenizer.json "
                       "with Hugging Face tokenizers " + tokenizers.__version__,
        "tokenizer": "all-MiniLM-L6-v2",
        "cases": cases,
    }
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, indent=1)
        f.write("\n")
    print("%d cases" % len(cases), file=sys.stderr)


if __name__ == "__main__":
    main()
