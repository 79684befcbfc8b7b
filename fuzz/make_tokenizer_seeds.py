#!/usr/bin/env python3
"""Writes the committed seed corpus for fuzz/tokenizer_fuzz.cpp: texts behind a flags byte
(bits 0-3: add_special, parse_special, render_special, keep leading space; bits 4-7: which
built-in vocabulary; 0xC_ is the WordPiece one), three tiny vocabulary GGUF files
(byte-level BPE, SentencePiece, WordPiece) for the file-loading path and a Hugging Face
tokenizer.json for the conversion path. Run: python3 fuzz/make_tokenizer_seeds.py fuzz/corpus/tokenizer"""
import json
import os
import struct
import sys


def s(x):
    b = x.encode("utf-8") if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def kv_str(key, val):
    return s(key) + struct.pack("<I", 8) + s(val)


def kv_u32(key, val):
    return s(key) + struct.pack("<II", 4, val)


def kv_bool(key, val):
    return s(key) + struct.pack("<IB", 7, 1 if val else 0)


def kv_arr(key, elem_type, items):
    body = struct.pack("<IIQ", 9, elem_type, len(items))
    for it in items:
        if elem_type == 8:
            body += s(it)
        elif elem_type == 5:
            body += struct.pack("<i", it)
        elif elem_type == 6:
            body += struct.pack("<f", it)
    return s(key) + body


def gguf(kvs):
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)


def byte_char(b):
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


def bpe_seed():
    tokens = [byte_char(b) for b in range(256)]
    merges = []
    for a, b in [(" ", "t"), ("h", "e"), (" t", "he"), ("i", "n"), ("in", "g")]:
        ea = "".join(byte_char(c) for c in a.encode())
        eb = "".join(byte_char(c) for c in b.encode())
        merges.append(ea + " " + eb)
        tokens.append(ea + eb)
    tokens += ["<|im_start|>", "<|im_end|>", "<0x-1>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 6]
    return gguf([kv_str("tokenizer.ggml.model", "gpt2"), kv_str("tokenizer.ggml.pre", "llama-bpe"),
                 kv_arr("tokenizer.ggml.tokens", 8, tokens), kv_arr("tokenizer.ggml.token_type", 5, types),
                 kv_arr("tokenizer.ggml.merges", 8, merges), kv_u32("tokenizer.ggml.bos_token_id", 261),
                 kv_u32("tokenizer.ggml.eos_token_id", 9999), kv_bool("tokenizer.ggml.add_bos_token", True)])


def spm_seed():
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces = ["\u2581", "\u2581t", "he", "\u2581the", "in", "ing", "e", "t", "h", "\u5bb6"]
    tokens += pieces + ["<|im_end|>"]
    types += [1] * len(pieces) + [3]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))] + [0.0]
    return gguf([kv_str("tokenizer.ggml.model", "llama"), kv_arr("tokenizer.ggml.tokens", 8, tokens),
                 kv_arr("tokenizer.ggml.token_type", 5, types), kv_arr("tokenizer.ggml.scores", 6, scores),
                 kv_str("general.name", "Phi-3 seed")])


def wpm_seed():
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    types = [3] * 5
    for w in ["hello", "world", "the", ",", "!", "\u4e2d"]:
        tokens.append("\u2581" + w)
        types.append(1)
    for w in ["ing", "s", "ed"]:
        tokens.append(w)
        types.append(1)
    return gguf([kv_str("tokenizer.ggml.model", "bert"), kv_arr("tokenizer.ggml.tokens", 8, tokens),
                 kv_arr("tokenizer.ggml.token_type", 5, types), kv_u32("tokenizer.ggml.bos_token_id", 2),
                 kv_u32("tokenizer.ggml.eos_token_id", 3), kv_u32("tokenizer.ggml.seperator_token_id", 3),
                 kv_u32("tokenizer.ggml.unknown_token_id", 1), kv_bool("tokenizer.ggml.add_eos_token", True)])


def tokenizer_json_seed():
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {t: i for i, t in enumerate(specials + ["hello", "world", "##s", "!", ",", "the"])}
    single = [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
              {"SpecialToken": {"id": "[SEP]", "type_id": 0}}]
    doc = {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(specials)],
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "TemplateProcessing", "single": single,
                           "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                                              "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
    }
    return json.dumps(doc).encode("utf-8")


def tokenizer_json_bpe_seed():
    """A byte-level BPE as Hugging Face saves Llama 3's: Split with its pattern, then ByteLevel."""
    g = "\u0120"  # the byte-level spelling of a space
    vocab = {t: i for i, t in enumerate(["h", "i", "e", "l", "o", g, g + "h", "hi", g + "hi", "he", "ll", "hell",
                                         "hello", "1", "2", "3"])}
    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
    doc = {
        "version": "1.0",
        "added_tokens": [{"id": 16, "content": "<|begin_of_text|>", "special": True},
                         {"id": 17, "content": "<|eot_id|>", "special": True},
                         {"id": 18, "content": "<tool>", "special": False}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [16],
                                                                    "tokens": ["<|begin_of_text|>"]}}},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "ignore_merges": True, "byte_fallback": False, "vocab": vocab,
                  "merges": [[g, "h"], ["h", "i"], [g + "h", "i"], ["h", "e"], ["l", "l"], ["he", "ll"],
                             ["hell", "o"]]},
    }
    return json.dumps(doc).encode("utf-8")


TEXTS = [
    (0x00, "Hello world, it's 12345!"),
    (0x13, "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"),
    (0x10, "The quick brown fox\tjumps  over\n\nthe lazy dog"),
    (0x20, "x = [1, 22, 333, 4444] # digits"),
    (0x50, "\u5bb6\u65cf \U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F3F3\ufe0f\u200d\U0001F308"),
    (0x60, "\u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd \u041f\u0440\u0438\u0432\u0435\u0442"),
    (0x77, "DON'T YOU'RE we'll I'M  " + " " * 40 + "end"),
    (0xB6, " the and ing \u2581 <tool> </s> <s>"),
    (0xBA, "  leading spaces and \u00e9\u00e9\u00e9"),
    (0xC3, "[CLS] Hello, World! The CAF\u00c9 \u4e2d\u6587 \u0416\u0438\u0437\u043d\u044c [SEP]"),
    (0xC1, "a\u0301\u0000b\tc\u00a0d \u00ad \ufeff \uac00 " + "x" * 120 + " thing-s"),
]


def main(out):
    os.makedirs(out, exist_ok=True)
    for i, (flags, text) in enumerate(TEXTS):
        with open(os.path.join(out, "text_%02d" % i), "wb") as f:
            f.write(bytes([flags]) + text.encode("utf-8"))
    with open(os.path.join(out, "bytes_broken"), "wb") as f:
        f.write(bytes([0x01]) + b"ok \xff\xfe\x80 \xc3 \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 end")
    with open(os.path.join(out, "bytes_broken_spm"), "wb") as f:
        f.write(bytes([0xB0]) + b"\xe2 \xf1\x85\x8a\xb8 \x14\x00x")
    with open(os.path.join(out, "vocab_bpe.gguf"), "wb") as f:
        f.write(bpe_seed())
    with open(os.path.join(out, "vocab_spm.gguf"), "wb") as f:
        f.write(spm_seed())
    with open(os.path.join(out, "vocab_wpm.gguf"), "wb") as f:
        f.write(wpm_seed())
    with open(os.path.join(out, "tokenizer.json"), "wb") as f:
        f.write(tokenizer_json_seed())
    with open(os.path.join(out, "tokenizer_bpe.json"), "wb") as f:
        f.write(tokenizer_json_bpe_seed())
    # A SentencePiece model (tests/fixtures/hf_checkpoints, made by sentencepiece there).
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "tests", "fixtures", "hf_checkpoints", "gemma3_tiny", "tokenizer.model"),
              "rb") as src, open(os.path.join(out, "sentencepiece_gemma.model"), "wb") as f:
        f.write(b"SPM:" + src.read())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus/tokenizer")
