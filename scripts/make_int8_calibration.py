"""Write crucible/kiln/minilm_activations.npz: per channel, the largest |value| each MatMul input of
the built-in model takes on real notes, the calibration its int8 graph is smoothed with
(crucible/kiln/embedder.py, SmoothQuant). Runs in the dev venv:

    V=$(scripts/setup --no-npm | tail -1); $V/python scripts/make_int8_calibration.py [KILN]

KILN defaults to the sample kiln (../shared/kilns/crucible-docs). Each chunk runs alone (no
padding); 400 chunks picked with a fixed seed. The fixture texts of tests/embedder are not used:
they are the check.
"""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crucible" / "kiln" / "minilm_activations.npz"
SAMPLE_KILN = ROOT.parent / "shared" / "kilns" / "crucible-docs"


def kiln_texts(kiln: Path, n: int = 400) -> list[str]:
    from crucible.kiln.chunking import chunk_note
    from crucible.kiln.notes import parse_note

    texts: list[str] = []
    for path in sorted(kiln.rglob("*.md")):
        if ".crucible" in path.parts:
            continue
        rel = path.relative_to(kiln).as_posix()
        note = parse_note(path.read_text(encoding="utf-8", errors="replace"), rel)
        texts.extend(chunk.text for chunk in chunk_note(note))
    random.Random(15).shuffle(texts)
    return texts[:n]


def main() -> None:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from tokenizers import Tokenizer

    from crucible.kiln.embedder import build_onnx_model, model_dir

    kiln = Path(sys.argv[1]) if len(sys.argv) > 1 else SAMPLE_KILN
    folder = model_dir()
    model = onnx.load_from_string(build_onnx_model(folder))
    inits = {i.name for i in model.graph.initializer}
    inputs = sorted({n.input[0] for n in model.graph.node
                     if n.op_type in ("MatMul", "Attention") and n.input[1] in inits})
    for name in inputs:
        model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=256)
    tokenizer.no_padding()
    maxima: dict[str, np.ndarray] = {}
    texts = kiln_texts(kiln)
    for text in texts:
        ids = np.array([tokenizer.encode(text).ids], np.int32)
        values = session.run(inputs, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        for name, value in zip(inputs, values, strict=True):
            peak = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
            maxima[name] = np.maximum(maxima[name], peak) if name in maxima else peak
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    arrays: dict[str, np.ndarray] = {k: v.astype(np.float32) for k, v in maxima.items()}
    arrays["weights_sha256"] = np.array(digest)
    np.savez_compressed(OUT, **arrays)  # type: ignore[arg-type]  # numpy's stub types allow_pickle in **kwds
    print(f"{OUT.relative_to(ROOT)}: {len(inputs)} inputs from {len(texts)} chunks of {kiln.name}")


if __name__ == "__main__":
    main()
