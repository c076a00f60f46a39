"""Config-level readers: each training stack's entry point as it takes the settings block ``--target`` prints.

spec_readers.py reads our files as each stack's dataset class does; these read
the printed *settings* as each stack's configuration code does, and fail the
way it would. Written from the stacks' sources (cited per reader); where the
stack's own package installs here its code is used instead (``transformers``
for AutoTokenizer; megatron-core's ``get_blend_from_list`` and tokenizers in
test_trainer_configs.py).

* KempnerForge (``kempnerforge/config/loader.py``, ``config/data.py``,
  ``config/model.py``, ``training/data_pipeline.py``): TOML; unknown keys of a
  section raise ``Unknown config keys in DataConfig``; with ``pack_sequences``
  and a ``dataset_path``, ``data.tokenizer_path is required when
  pack_sequences=True``, and the EOS id is
  ``AutoTokenizer.from_pretrained(tokenizer_path).eos_token_id``.
* Megatron-LM ``pretrain_gpt.py`` (``megatron/training/arguments.py``,
  ``training/utils.py`` ``get_blend_and_blend_per_split``, the tokenizer
  builders): argparse flags; ``--per-split-data-args-path`` JSON with the keys
  train, valid, test; the EOD of ``HuggingFaceTokenizer`` is its
  ``eos_token`` id; ``NullTokenizer``'s is ``vocab_size`` (megatron-core
  0.16.1, older Megatron-LM) or ``vocab_size - 1`` unless
  ``--null-tokenizer-eod-id`` (Megatron-LM d98e8a64, where that flag exists).
* OLMo-core 3.0.0 (``olmo_core/data/numpy_dataset.py``, ``data/tokenizer.py``,
  ``io.deterministic_glob_directory``): ``NumpyFSLDatasetConfig`` keyword
  fields; ``expand_glob`` expands each path sorted, a pattern matching nothing
  raises ``FileNotFoundError``.
* NeMo Automodel 0.7.0 ``NanogptDataset(file_pattern, seq_len, *, bos_token,
  shuffle_files, align_to_bos)`` from YAML ``_target_``; ``sorted(glob)``.
* nanoGPT ``configurator.py`` / ``train.py``: the config file is executed in
  train.py's globals; ``data_dir = os.path.join('data', dataset)``.
* modded-nanogpt ``Hyperparameters``: ``train_files`` / ``val_files`` globs.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import shlex
import tomllib
from pathlib import Path
from typing import Any

import yaml


def printed_block(out: str) -> str:
    """The settings as printed by ``build --target`` / ``validate --for``: the lines after ``settings for ...:``
    up to the ``published`` line (a build's last two lines) or the end."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("settings for ")) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("published ")), len(lines))
    return "\n".join(lines[start:end])


# -- KempnerForge -----------------------------------------------------------------------------------------

KF_DATA_FIELDS = {
    "dataset_path", "file_pattern", "tokenizer_path", "num_workers", "pin_memory", "prefetch_factor",
    "hf_dataset_name", "hf_dataset_config", "hf_dataset_split", "hf_dataset_text_field", "hf_dataset_image_field",
    "hf_dataset_prompt_field", "hf_image_size", "hf_streaming", "pack_sequences", "datasets", "mix_temperature",
    "phases", "anneal_start_step", "anneal_weights",
}  # fmt: skip
KF_MODEL_FIELDS = {
    "dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim_multiplier", "ffn_hidden_dim", "norm_type",
    "norm_eps", "activation", "max_seq_len", "rope_theta", "tie_embeddings", "qk_norm", "init_std", "model_type",
    "num_experts", "moe_top_k", "moe_frequency", "moe_router", "moe_shared_experts", "moe_aux_loss_weight",
    "moe_capacity_factor", "moe_sequence_aux_loss_weight", "moe_gradient_scale", "moe_bias_schedule",
    "moe_packed_experts",
}  # fmt: skip


def kempnerforge_job(block: str) -> tuple[dict[str, Any], int | None]:
    """``(the [data] table with DataConfig's defaults, the EOS id its train.py resolves for packing)``."""
    config = tomllib.loads(block)
    for section, known, cls in (("data", KF_DATA_FIELDS, "DataConfig"), ("model", KF_MODEL_FIELDS, "ModelConfig")):
        unknown = set(config.get(section, {})) - known
        if unknown:
            raise ValueError(f"Unknown config keys in {cls}: {sorted(unknown)}. Valid keys: {sorted(known)}")
    data = {"dataset_path": "", "file_pattern": "*.npy", "tokenizer_path": "", "pack_sequences": False, **config["data"]}
    eos = None
    if data["pack_sequences"] and data["dataset_path"]:
        if not data["tokenizer_path"]:
            raise ValueError("data.tokenizer_path is required when pack_sequences=True")
        from transformers import AutoTokenizer

        eos = AutoTokenizer.from_pretrained(data["tokenizer_path"]).eos_token_id
        if eos is None:  # MemoryMappedDataset would pack with no document boundary
            raise ValueError(f"{data['tokenizer_path']}: AutoTokenizer loads no eos_token_id, packing has no EOS")
    return data, eos


def kempnerforge_files(data: dict[str, Any]) -> list[Path]:
    return [Path(p) for p in sorted(glob.glob(str(Path(data["dataset_path"]) / data["file_pattern"])))]


# -- Megatron-LM ------------------------------------------------------------------------------------------

MEGATRON_TOKENIZERS = (
    "BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer", "MultimodalTokenizer",
    "NullTokenizer", "NullMultimodalTokenizer", "SFTTokenizer",
)  # fmt: skip
MEGATRON_RELEASES = ("core-0.16.1", "d98e8a64")


class _Refused(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print usage and exit 2
        raise ValueError(f"pretrain_gpt.py: error: {message}")


def megatron_parser(release: str) -> argparse.ArgumentParser:
    """The flags of Megatron-LM's ``_add_data_args`` / ``_add_tokenizer_args`` the settings may use."""
    p = _Refused(prog="pretrain_gpt.py", allow_abbrev=False)
    p.add_argument("--data-path", nargs="*", default=None)
    p.add_argument("--data-args-path", type=str, default=None)
    p.add_argument("--per-split-data-args-path", type=str, default=None)
    for split in ("train", "valid", "test"):
        p.add_argument(f"--{split}-data-path", nargs="*", default=None)
    p.add_argument("--tokenizer-type", type=str, default=None, choices=MEGATRON_TOKENIZERS)
    p.add_argument("--tokenizer-model", type=str, default=None)
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--seq-length", type=int, default=None)
    p.add_argument("--eod-mask-loss", action="store_true")
    if release == "d98e8a64":
        p.add_argument("--null-tokenizer-eod-id", type=int, default=None)
    return p


def megatron_args(block: str, release: str) -> argparse.Namespace:
    """The printed flags as a shell passes them (``#`` starts a comment), parsed by ``release``'s parser."""
    argv = [a for line in block.splitlines() for a in shlex.split(line, comments=True)]
    return megatron_parser(release).parse_args(argv)


def megatron_blend_per_split(args: argparse.Namespace) -> list[list[str] | None]:
    """``[train, valid, test]`` prefixes as ``get_blend_and_blend_per_split`` gets them (weights dropped)."""
    if args.data_path is not None or args.data_args_path is not None:
        raise ValueError("the settings give one blend, not one per split")
    if args.per_split_data_args_path is not None:
        with open(args.per_split_data_args_path) as f:
            per_split = json.load(f)
        for split in ("train", "valid", "test"):  # a KeyError there, as in Megatron, if a key is missing
            if isinstance(per_split[split], str):
                per_split[split] = per_split[split].split()
        return [per_split["train"], per_split["valid"], per_split["test"]]
    return [args.train_data_path, args.valid_data_path, args.test_data_path]


def megatron_eod(args: argparse.Namespace, release: str) -> int:
    """The end-of-document id the tokenizer these flags build has in ``release``."""
    if args.tokenizer_type is None:
        raise NotImplementedError("None tokenizer is not implemented.")
    if args.tokenizer_type == "NullTokenizer":
        if args.vocab_size is None:
            raise ValueError("NullTokenizer needs --vocab-size")
        set_eod = getattr(args, "null_tokenizer_eod_id", None)
        if release == "d98e8a64":
            return set_eod if set_eod is not None else args.vocab_size - 1
        return args.vocab_size
    if args.tokenizer_type == "HuggingFaceTokenizer":
        if not args.tokenizer_model:
            raise ValueError("HuggingFaceTokenizer needs --tokenizer-model")
        from transformers import AutoTokenizer

        eos = AutoTokenizer.from_pretrained(args.tokenizer_model).eos_token_id
        if eos is None:
            raise ValueError(f"{args.tokenizer_model}: the tokenizer has no eos_token, so no EOD")
        return int(eos)
    raise NotImplementedError(f"this reader does not model --tokenizer-type {args.tokenizer_type}")


# -- OLMo-core --------------------------------------------------------------------------------------------

OLMO_FSL_FIELDS = {
    "tokenizer", "paths", "mix", "mix_base_dir", "expand_glob", "dtype", "metadata", "include_instance_metadata",
    "instance_filter_config", "source_permutation_seed", "work_dir", "ignore_fingerprint_mismatch",
    "sequence_length", "max_target_sequence_length", "generate_doc_lengths", "label_mask_paths",
    "source_mixture_config",
}  # fmt: skip
OLMO_TOKENIZER_FIELDS = {"vocab_size", "eos_token_id", "pad_token_id", "bos_token_id", "identifier"}
OLMO_DTYPES = ("uint8", "uint16", "uint32", "uint64")


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "NumpyDatasetDType":
        if node.attr not in OLMO_DTYPES:
            raise AttributeError(f"NumpyDatasetDType has no member {node.attr!r}")
        return node.attr
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "TokenizerConfig":
        kwargs = {k.arg: _literal(k.value) for k in node.keywords}
        unknown = set(kwargs) - OLMO_TOKENIZER_FIELDS
        missing = {"vocab_size", "eos_token_id", "pad_token_id"} - set(kwargs)
        if unknown or missing or node.args:
            raise TypeError(f"TokenizerConfig: unknown {sorted(unknown)}, missing {sorted(missing)}")
        return kwargs
    return ast.literal_eval(node)


def olmo_fsl_config(block: str) -> dict[str, Any]:
    """The printed ``NumpyFSLDatasetConfig(...)`` call's keyword fields, checked as its dataclass checks them."""
    (stmt,) = [s for s in ast.parse(block).body]
    call = stmt.value  # type: ignore[attr-defined]
    assert isinstance(call, ast.Call) and call.func.id == "NumpyFSLDatasetConfig" and not call.args  # type: ignore[attr-defined]
    config = {k.arg: _literal(k.value) for k in call.keywords}
    unknown = set(config) - OLMO_FSL_FIELDS
    if unknown:
        raise TypeError(f"NumpyFSLDatasetConfig.__init__() got unexpected keyword arguments {sorted(unknown)}")
    if "tokenizer" not in config or "sequence_length" not in config or config["sequence_length"] <= 0:
        raise TypeError("NumpyFSLDatasetConfig needs tokenizer and a positive sequence_length")
    return config


def olmo_paths(config: dict[str, Any]) -> list[str]:
    """``_resolve_paths_metadata``: each pattern expanded sorted when ``expand_glob``, else the paths as given."""
    if not config.get("expand_glob"):
        return [str(p) for p in config["paths"]]
    out: list[str] = []
    for pattern in config["paths"]:
        matches = sorted(glob.glob(pattern))
        if not matches:
            raise FileNotFoundError(f"Pattern '{pattern}' did not match any files")
        out += matches
    return out


# -- NeMo Automodel, nanoGPT, modded-nanogpt --------------------------------------------------------------

NEMO_TARGET = "nemo_automodel.components.datasets.llm.nanogpt_dataset.NanogptDataset"
NEMO_ARGS = {"file_pattern", "seq_len", "bos_token", "shuffle_files", "align_to_bos"}


def nemo_datasets(block: str) -> dict[str, dict[str, Any]]:
    """Each ``*dataset:`` section: its NanogptDataset arguments and ``files`` (``sorted(glob(file_pattern))``)."""
    out = {}
    for key, section in yaml.safe_load(block).items():
        args = dict(section)
        if args.pop("_target_") != NEMO_TARGET or set(args) - NEMO_ARGS or not {"file_pattern", "seq_len"} <= set(args):
            raise TypeError(f"{key}: not NanogptDataset's arguments: {sorted(section)}")
        if args.get("align_to_bos") and args.get("bos_token") is None:
            raise ValueError("bos_token must be provided when align_to_bos is True")
        args["files"] = sorted(glob.glob(str(args["file_pattern"])))
        if not args["files"]:
            raise FileNotFoundError(f"No files matched pattern {args['file_pattern']}")
        out[key] = args
    return out


NANOGPT_GLOBALS = {"dataset": "openwebtext", "batch_size": 12, "block_size": 1024, "out_dir": "out"}


def nanogpt_config(block: str, cwd: Path) -> dict[str, Any]:
    """train.py's globals after ``configurator.py`` executes the block; ``data_dir`` as train.py derives it.
    A ``#   ln -s SRC DST`` line, the setup the block prints, is done in ``cwd`` first."""
    for line in block.splitlines():
        words = line.lstrip("# ").split()
        if words[:2] == ["ln", "-s"]:
            dst = cwd / words[3]
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(words[2])
    scope = dict(NANOGPT_GLOBALS)
    exec(compile(block, "config.py", "exec"), {}, scope)
    unknown = set(scope) - set(NANOGPT_GLOBALS)
    assert not unknown, f"train.py has no globals {sorted(unknown)}"
    return {**scope, "data_dir": cwd / "data" / scope["dataset"]}


MODDED_FIELDS = {"train_files", "val_files", "val_tokens", "train_seq_len", "val_seq_len", "num_iterations"}


def modded_hyperparameters(block: str) -> dict[str, Any]:
    scope: dict[str, Any] = {}
    exec(compile(block, "Hyperparameters", "exec"), {}, scope)
    unknown = set(scope) - MODDED_FIELDS
    assert not unknown, f"Hyperparameters has no fields {sorted(unknown)}"
    return scope
