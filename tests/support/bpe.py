"""A small byte-level BPE tokenizer of the Qwen kind, trained here in well under a second:
Qwen2's pre-tokenizer pattern (punctuation takes the newlines after it, newline runs are
one pre-token) and a vocabulary that merges ``"\\n\\n"``, so tests exercise what a
WordPiece tokenizer cannot show. Deterministic: the same corpus gives the same merges."""

from __future__ import annotations

from typing import Any

# Qwen2 / Qwen3 tokenizer.json pre-tokenizer pattern.
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|rerank_token|>", "<|embed_token|>"]
_PARAGRAPHS = [
    "Paris is the capital of France.\n\nThe Eiffel Tower is in Paris.",
    "Berlin is in Germany.\n\nIt is a large city.\n\nMany people live there.",
    "What is the capital of France?\n\nAnswer yes or no.",
    "Line one\nline two\n\n\tindented line\n\n  two spaces and a tab\there.",
    "Numbers 12345 and 2026, e.g. 3.14; done!\n\nyes\n\nno",
]


def train_qwen_like() -> Any:
    """A ``PreTrainedTokenizerFast`` with Qwen's pre-tokenizer and a trained BPE."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_PARAGRAPHS * 50, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:],
    )
