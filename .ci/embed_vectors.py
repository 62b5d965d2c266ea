#!/usr/bin/env python3
"""Reference sentence vectors for measuring the search before (or beside) the Rust model:
every event text and query text of the given labelled sets, embedded by
sentence-transformers (PyTorch, CPU), L2-normalised, written as one JSON object
{text: [floats]} that `swarm quality --set SET --embed-vectors FILE` reads through
`embed::Table` (a text it does not hold is an error, never a made-up vector).

    python3 .ci/embed_vectors.py MODEL_DIR OUT.json data/fixtures/semantic/tune.jsonl data/fixtures/semantic/heldout.jsonl

Needs `pip install sentence-transformers` (a test-only virtualenv); MODEL_DIR is a
sentence-transformers directory such as all-MiniLM-L6-v2.
"""
import json, sys

from sentence_transformers import SentenceTransformer

def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    model_dir, out, sets = sys.argv[1], sys.argv[2], sys.argv[3:]
    texts = set()
    for f in sets:
        for line in open(f, encoding="utf-8"):
            r = json.loads(line)
            if r.get("kind") == "event" and isinstance(r.get("content"), str):
                texts.add(r["content"])
            if r.get("kind") == "query":
                texts.add(r["text"])
    texts = sorted(texts)
    m = SentenceTransformer(model_dir, device="cpu")
    v = m.encode(texts, batch_size=64, normalize_embeddings=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({t: [round(float(x), 7) for x in row] for t, row in zip(texts, v)}, f)
    print(f"{len(texts)} texts -> {out}")

if __name__ == "__main__":
    main()
