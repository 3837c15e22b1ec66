"""Build the small random-weight scoring models the end-to-end suite serves with vLLM.

Run with the Python of a vLLM CPU environment (it has torch, transformers and tokenizers):

    VLLM_PY=$(scripts/vllm-cpu-env 0.29.0)
    $VLLM_PY scripts/prepare_models.py MINILM_DIR OUT_DIR

Prints one ``NAME PATH`` line per model. Weights are seeded and tokenizers are trained here
from a built-in corpus, so every machine builds identical models; they are never committed.
Token accounting is real (real tokenizer types and pipelines); scores are meaningless.
- cross-encoder-tiny: BertForSequenceClassification with num_labels=1 (MiniLM tokenizer).
- colbert-tiny: HF_ColBERT = a small BERT ("bert." weights) plus a bias-free
  ``linear.weight`` projection (64 -> 32). No dim/colbert_dim/projection_dim key in
  config.json: vLLM infers the size from the weights (those keys crash 0.29.0 and 0.32.0).
The families users deploy beyond BERT (issue #30), each with a tokenizer of the real type:
- xlmr-ce-tiny: XLMRobertaForSequenceClassification, num_labels=1, SentencePiece-Unigram
  tokenizer with XLM-R's ``<s> q </s></s> d </s>`` pair template (as bge-reranker-v2-m3).
- xlmr-embed-tiny: XLMRobertaModel (multilingual-e5, bge-m3); the config needs
  ``position_embedding_type``.
- qwen3-embed-tiny: Qwen3ForCausalLM served with ``--runner pooling`` (Qwen3-Embedding):
  byte-level BPE whose post-processor appends ``<|endoftext|>``.
- qwen3-reranker-tiny: the original Qwen3-Reranker layout (``Qwen3ForCausalLM``), served
  with hf_overrides turning it into Qwen3ForSequenceClassification and the score template
  ``qwen3_reranker.jinja`` written next to it (see ``scripts/vllm_cpu.serve_args``).
- jina-v3-tiny: JinaForRanking (jina-reranker-v3: a Qwen3 body and a 512-wide projector).
- qwen3-gen-tiny: Qwen3ForCausalLM served to generate (issue #44's doors: beam search,
  stored responses, the prefix cache), with a ChatML chat template.
- modernbert-colbert-tiny: ColBERTModernBertModel (GTE-ModernColBERT), byte-level BPE with
  ``[CLS] $A [SEP]``.
- whisper-tiny: WhisperForConditionalGeneration with whisper-tiny's real vocabulary (issue
  #49): Whisper's BPE ranks and special tokens come from the ``openai-whisper`` sdist on
  PyPI (downloaded once with pip into ``OUT_DIR/.downloads``; no model hub), turned into a
  Hugging Face tokenizer by transformers' TikTokenConverter; a tiny random body.
- voxtral-realtime-tiny: Voxtral realtime in Mistral format (params.json, a streaming
  tekken.json built on the Tekken vocabulary mistral_common ships), for /v1/realtime;
  no weights: served with ``--load-format dummy``.
The Qwen vocabularies hold Qwen's special tokens at their real ids (151643...), ``yes`` and
``no`` as single tokens, and merge ``"\n\n"`` into one token (long texts with blank lines).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)
MARKER = ".complete"
# Bump when a builder changes what it writes: a model built by an older builder is rebuilt.
BUILD_VERSION = "2"


def small_bert_config(minilm: Path) -> dict[str, object]:
    config = json.loads((minilm / "config.json").read_text())
    config.update(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
    )
    config.pop("_name_or_path", None)
    return config


def copy_tokenizer(minilm: Path, target: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copy(minilm / name, target / name)


def build_cross_encoder(minilm: Path, target: Path) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(**small_bert_config(minilm), num_labels=1)
    config.architectures = ["BertForSequenceClassification"]
    BertForSequenceClassification(config).save_pretrained(target, safe_serialization=True)
    copy_tokenizer(minilm, target)


def build_colbert(minilm: Path, target: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    torch.manual_seed(1)
    raw = small_bert_config(minilm)
    bert = BertModel(BertConfig(**raw), add_pooling_layer=False)
    weights = {f"bert.{k}": v.contiguous() for k, v in bert.state_dict().items()}
    weights["linear.weight"] = torch.randn(32, int(raw["hidden_size"])) * 0.05  # type: ignore[call-overload]
    target.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(target / "model.safetensors"))
    config = {**raw, "architectures": ["HF_ColBERT"], "model_type": "bert"}
    (target / "config.json").write_text(json.dumps(config, indent=2))
    copy_tokenizer(minilm, target)


# --- the built-in training corpus -------------------------------------------------------

_SUBJECTS = (
    "Paris",
    "Berlin",
    "The Eiffel Tower",
    "The capital",
    "The city",
    "The river",
    "A museum",
    "The tower",
    "Germany",
    "France",
    "The question",
    "The answer",
    "A passage",
    "The query",
    "The document",
    "The model",
    "A search",
    "The engine",
    "Seoul",
    "Tokyo",
)
_VERBS = (
    "is",
    "is in",
    "is the capital of",
    "answers",
    "is near",
    "was built in",
    "belongs to",
    "describes",
    "is relevant to",
    "is not relevant to",
    "meets",
    "ranks",
)
_OBJECTS = (
    "France",
    "Germany",
    "Paris",
    "the query",
    "the document",
    "the question",
    "Europe",
    "the river",
    "the passage",
    "the instruction",
    "the requirements",
    "the answer",
)
_WORD_TEXT = (
    "what where which who when why how capital tower city country river museum question "
    "answer passage document query instruct instruction requirements relevant relevance "
    "search web retrieve retrieval judge whether meets based provided note only yes no "
    "word line one two tab here full emoji only Greek text words long short paragraph "
    "system user assistant think rank passages identifier numerical provide will you I "
    "line break blank lines text with newlines"
)
_WORDS = _WORD_TEXT.split()
_MULTILINGUAL = (
    "Où est la tour Eiffel? Ça coûte 5 € — naïve façade. La capitale de la France est Paris.",
    "東京は日本の首都です。大阪は大きな都市です。",
    "대한민국의 수도는 어디입니까. 서울은 대한민국의 수도입니다. 부산은 항구 도시입니다. "
    "제주도는 섬입니다. 평양",
    "Ελληνικά κείμενα. Η Αθήνα είναι η πρωτεύουσα.",  # noqa: RUF001
    "🙂🚀 emoji only 🗼 ｆｕｌｌ width",  # noqa: RUF001
    'Note that the answer can only be "yes" or "no". yes no yes no',
    "line one\nline two\ttab\there",
)


def corpus() -> list[str]:
    """A few thousand deterministic lines: sentences, paragraphs with blank lines, the
    e2e suite's texts in several scripts, and the Qwen3-Reranker prompt's words."""
    lines: list[str] = []
    for subject, verb, obj in itertools.product(_SUBJECTS, _VERBS, _OBJECTS):
        lines.append(f"{subject} {verb} {obj}.")
    for i in range(400):
        words = [_WORDS[(i * 7 + k * 13) % len(_WORDS)] for k in range(12)]
        lines.append(" ".join(words[:6]) + "\n\n" + " ".join(words[6:]) + "?\n\n")
    for i, text in enumerate(_MULTILINGUAL * 40):
        lines.append(f"{text} {i % 10}")
    lines.extend(["yes", "no", "Yes", "No", " yes", " no"] * 50)
    rng = random.Random(30)
    syllables = [c + v for c in "bcdfghjklmnprstvwzBCDFGHJKLMNPRSTVWZ" for v in "aeiouy"]
    for _ in range(3000):
        words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(8)]
        lines.append(" ".join(words) + rng.choice((".", "?", "!", ",", ";", ":", "\n\n")))
    lines.append(ALPHABET)
    return lines


# Every printable ASCII character, so that no ASCII text is <unk> to the Unigram model.
ALPHABET = "".join(chr(c) for c in range(33, 127))


# --- tokenizers -------------------------------------------------------------------------

# Qwen2/Qwen3's pre-tokenizer regex (tokenizer.json of Qwen/Qwen3-*): "\s*[\r\n]+" keeps a
# blank line together, so the BPE can merge "\n\n" into one token.
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_FIRST_SPECIAL = 151643
# (content, special) from id 151643 on, as in Qwen3's tokenizer.json.
QWEN_ADDED = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", True),
    ("<|fim_middle|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_pad|>", True),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
# jina-reranker-v3 adds three tokens; vLLM's JinaForRankingPool looks for ids 151670 (doc)
# and 151671 (query). The first one's name is a placeholder.
JINA_ADDED = (
    ("<|jina_reserved_0|>", True),
    ("<|embed_token|>", True),
    ("<|rerank_token|>", True),
)
QWEN_VOCAB_TRAINED = 3000


def _added(content: str, token_id: int, special: bool) -> dict[str, Any]:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": not special,
        "special": special,
    }


def qwen_tokenizer_json(*, end_token: bool, extra: tuple[tuple[str, bool], ...] = ()) -> str:
    """A Qwen2/Qwen3-style byte-level BPE tokenizer.json: trained on the corpus, its vocab
    padded with unreachable filler entries so the special tokens sit at Qwen's ids.
    ``end_token``: the post-processor appends ``<|endoftext|>`` (Qwen3-Embedding);
    otherwise it adds nothing (Qwen3 base, Qwen3-Reranker, jina-reranker-v3)."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tokenizer = Tokenizer(BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=QWEN_VOCAB_TRAINED,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    spec = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    for token_id in range(len(vocab), QWEN_FIRST_SPECIAL):
        vocab[f"<|vocab_filler_{token_id}|>"] = token_id
    added = [
        _added(content, QWEN_FIRST_SPECIAL + i, special)
        for i, (content, special) in enumerate(QWEN_ADDED + extra)
    ]
    spec["added_tokens"] = added
    for needed in ("yes", "no", "\u010a\u010a"):  # "ĊĊ" is "\n\n" in byte-level form
        if needed not in vocab:
            raise RuntimeError(f"the trained Qwen vocabulary lacks {needed!r}")
    if end_token:
        spec["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            ],
            "pair": [
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
                {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}},
            ],
            "special_tokens": {
                "<|endoftext|>": {
                    "id": "<|endoftext|>",
                    "ids": [QWEN_FIRST_SPECIAL],
                    "tokens": ["<|endoftext|>"],
                }
            },
        }
    else:
        spec["post_processor"] = {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        }
    return json.dumps(spec, ensure_ascii=False)


def write_qwen_tokenizer(
    target: Path, *, end_token: bool, eos: str, extra: tuple[tuple[str, bool], ...] = ()
) -> None:
    (target / "tokenizer.json").write_text(qwen_tokenizer_json(end_token=end_token, extra=extra))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": eos,
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_prefix_space": False,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": 32768,
    }
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


XLMR_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")


def write_xlmr_tokenizer(target: Path) -> None:
    """A SentencePiece-Unigram tokenizer.json with XLM-R's pipeline: NFKC (XLM-R's
    precompiled charsmap is NFKC-based), runs of spaces folded, Metaspace, and the
    ``<s> $A </s>`` / ``<s> $A </s> </s> $B </s>`` templates."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import Unigram
    from tokenizers.processors import TemplateProcessing

    tokenizer = Tokenizer(Unigram())
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=2000,
        special_tokens=list(XLMR_SPECIALS),
        unk_token="<unk>",
        initial_alphabet=list(ALPHABET),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    # The trainer's sums differ in the last bits from run to run and equal scores come out
    # in hash order: round the scores and sort the pieces (the special tokens stay first)
    # so that every build writes the same file.
    spec = json.loads(tokenizer.to_str())
    vocab = [(piece, round(score, 3)) for piece, score in spec["model"]["vocab"]]
    specials, pieces = vocab[: len(XLMR_SPECIALS)], vocab[len(XLMR_SPECIALS) :]
    # The characters the trainer appends last get scores 1e-4 apart in hash order: one score.
    floor = round(min(score for _, score in pieces) + 0.01, 2)
    pieces = [(piece, max(score, floor)) for piece, score in pieces]
    pieces.sort(key=lambda item: (-item[1], item[0]))
    spec["model"]["vocab"] = [list(item) for item in specials + pieces]
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.add_special_tokens(["<mask>"])
    tokenizer.post_processor = TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tokenizer.save(str(target / "tokenizer.json"))
    config = {
        "tokenizer_class": "XLMRobertaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "sep_token": "</s>",
        "cls_token": "<s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
        "model_max_length": 512,
    }
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


MODERNBERT_SPECIALS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")


def write_modernbert_tokenizer(target: Path) -> None:
    """ModernBERT's kind: GPT-2 style byte-level BPE with ``[CLS] $A [SEP]`` templates."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from tokenizers.processors import TemplateProcessing

    tokenizer = Tokenizer(BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    tokenizer.add_special_tokens(list(MODERNBERT_SPECIALS))
    ids = {t: tokenizer.token_to_id(t) for t in MODERNBERT_SPECIALS}
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    tokenizer.save(str(target / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "[UNK]",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "mask_token": "[MASK]",
        "model_max_length": 8192,
    }
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


# --- the models -------------------------------------------------------------------------


def _patch_config(target: Path, **changes: Any) -> None:
    path = target / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    config.pop("_name_or_path", None)
    path.write_text(json.dumps(config, indent=2))


def _vocab_size(target: Path) -> int:
    from tokenizers import Tokenizer

    return int(Tokenizer.from_file(str(target / "tokenizer.json")).get_vocab_size(True))


def _xlmr_config(vocab_size: int, num_labels: int | None = None) -> Any:
    from transformers import XLMRobertaConfig

    extra = {} if num_labels is None else {"num_labels": num_labels}
    return XLMRobertaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=514,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **extra,
    )


def build_xlmr_ce(target: Path) -> None:
    import torch
    from transformers import XLMRobertaForSequenceClassification

    write_xlmr_tokenizer(target)
    torch.manual_seed(2)
    model = XLMRobertaForSequenceClassification(_xlmr_config(_vocab_size(target), num_labels=1))
    model.config.architectures = ["XLMRobertaForSequenceClassification"]
    model.save_pretrained(target, safe_serialization=True)
    _patch_config(target, position_embedding_type="absolute", num_labels=1)


def build_xlmr_embed(target: Path) -> None:
    import torch
    from transformers import XLMRobertaModel

    write_xlmr_tokenizer(target)
    torch.manual_seed(3)
    model = XLMRobertaModel(_xlmr_config(_vocab_size(target)), add_pooling_layer=False)
    model.config.architectures = ["XLMRobertaModel"]
    model.save_pretrained(target, safe_serialization=True)
    _patch_config(target, position_embedding_type="absolute")


def _qwen3_config(vocab_size: int, **extra: Any) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=QWEN_FIRST_SPECIAL,
        eos_token_id=QWEN_FIRST_SPECIAL,
        **extra,
    )


QWEN_VOCAB = QWEN_FIRST_SPECIAL + len(QWEN_ADDED)  # 151669
JINA_VOCAB = QWEN_VOCAB + len(JINA_ADDED)  # 151672


def build_qwen3_causal(target: Path, seed: int, eos: str, *, end_token: bool) -> None:
    import torch
    from transformers import Qwen3ForCausalLM

    write_qwen_tokenizer(target, end_token=end_token, eos=eos)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(_qwen3_config(QWEN_VOCAB))
    model.config.architectures = ["Qwen3ForCausalLM"]
    model.save_pretrained(target, safe_serialization=True)
    _patch_config(target)


def build_qwen3_embed(target: Path) -> None:
    build_qwen3_causal(target, 4, "<|endoftext|>", end_token=True)


# ChatML, as Qwen3's own template renders a conversation without tools or thinking.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] if message['content'] is string else '' }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_qwen3_generate(target: Path) -> None:
    """qwen3-gen-tiny: Qwen3ForCausalLM served as a generate model (chat, completions,
    Responses), with a ChatML chat template; its output is noise, its token counts real."""
    build_qwen3_causal(target, 5, "<|im_end|>", end_token=False)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHATML_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2))


# The score template users pass with --chat-template for the original Qwen3-Reranker:
# the prompt of the Qwen3-Reranker model card (system judge prompt, "<Instruct>: ...",
# "<Query>: ...", "<Document>: ...", an empty think block), the query and document taken
# from the messages of roles "query" and "document" that vLLM's scorer passes, and the
# instruction from chat_template_kwargs / the request's "instruction".
QWEN3_RERANKER_TEMPLATE = (
    "{%- set ns = namespace(query='', document='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'query' -%}{%- set ns.query = message['content'] -%}"
    "{%- elif message['role'] == 'document' -%}{%- set ns.document = message['content'] -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "<|im_start|>system\n"
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
    "<Instruct>: {{ instruction if instruction is defined and instruction else "
    "'Given a web search query, retrieve relevant passages that answer the query' }}\n"
    "<Query>: {{ ns.query }}\n"
    "<Document>: {{ ns.document }}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


def build_qwen3_reranker(target: Path) -> None:
    build_qwen3_causal(target, 5, "<|im_end|>", end_token=False)
    (target / "qwen3_reranker.jinja").write_text(QWEN3_RERANKER_TEMPLATE)


def build_jina_v3(target: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Model

    write_qwen_tokenizer(target, end_token=False, eos="<|im_end|>", extra=JINA_ADDED)
    torch.manual_seed(6)
    config = _qwen3_config(JINA_VOCAB)
    body = Qwen3Model(config)
    weights = {f"model.{k}": v.contiguous() for k, v in body.state_dict().items()}
    hidden = config.hidden_size
    weights["projector.0.weight"] = torch.randn(hidden // 2, hidden) * 0.05
    weights["projector.2.weight"] = torch.randn(512, hidden // 2) * 0.05
    save_file(weights, str(target / "model.safetensors"))
    raw = config.to_dict()
    raw.update(architectures=["JinaForRanking"], model_type="qwen3", embedding_size=512)
    raw.pop("_name_or_path", None)
    (target / "config.json").write_text(json.dumps(raw, indent=2))


def build_modernbert_colbert(target: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import ModernBertConfig, ModernBertModel

    write_modernbert_tokenizer(target)
    vocab = json.loads((target / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    torch.manual_seed(7)
    config = ModernBertConfig(
        vocab_size=max(ids.values()) + 1,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=512,
        local_attention=128,
        global_attn_every_n_layers=2,
        pad_token_id=ids["[PAD]"],
        bos_token_id=ids["[CLS]"],
        eos_token_id=ids["[SEP]"],
        cls_token_id=ids["[CLS]"],
        sep_token_id=ids["[SEP]"],
    )
    body = ModernBertModel(config)
    weights = {k: v.contiguous() for k, v in body.state_dict().items()}
    weights["linear.weight"] = torch.randn(32, config.hidden_size) * 0.05
    save_file(weights, str(target / "model.safetensors"))
    raw = config.to_dict()
    raw.update(architectures=["ColBERTModernBertModel"], model_type="modernbert")
    raw.pop("_name_or_path", None)
    (target / "config.json").write_text(json.dumps(raw, indent=2))


# --- whisper-tiny (issue #49) -----------------------------------------------------------

# The PyPI package whose source distribution ships Whisper's BPE vocabulary
# (whisper/assets/multilingual.tiktoken) and the order of its special tokens
# (whisper/tokenizer.py, get_encoding): only those two files are read, nothing is installed.
OPENAI_WHISPER = "openai-whisper==20250625"
WHISPER_FILES = ("whisper/tokenizer.py", "whisper/assets/multilingual.tiktoken")
# multilingual whisper-tiny: 99 languages, so 50,257 BPE ranks + 1,608 added tokens
WHISPER_LANGUAGES = 99


def whisper_sources(downloads: Path) -> Path:
    """openai-whisper's tokenizer module and vocabulary, from its sdist (downloaded once into
    ``downloads`` with pip, as any package; no model hub): the directory holding ``whisper/``."""
    import subprocess
    import tarfile

    found = sorted(downloads.glob("openai_whisper-*.tar.gz"))
    if not found:
        downloads.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check"]
        subprocess.run(
            [*pip, "--no-deps", "--no-binary", ":all:", OPENAI_WHISPER, "-d", str(downloads)],
            check=True,
        )
        found = sorted(downloads.glob("openai_whisper-*.tar.gz"))
    root = downloads / found[-1].name.removesuffix(".tar.gz")
    if not all((root / name).is_file() for name in WHISPER_FILES):
        with tarfile.open(found[-1]) as sdist:
            members = [sdist.getmember(f"{root.name}/{name}") for name in WHISPER_FILES]
            sdist.extractall(downloads, members=members, filter="data")
    return root


def whisper_specials(sources: Path) -> list[str]:
    """The added tokens of multilingual Whisper in id order, as openai-whisper makes them:
    ``<|endoftext|>`` (50257), ``<|startoftranscript|>``, the 99 languages, ``<|translate|>``,
    ``<|transcribe|>``, ``<|startoflm|>``, ``<|startofprev|>``, ``<|nospeech|>``,
    ``<|notimestamps|>`` (50363), then the timestamps ``<|0.00|>`` to ``<|30.00|>``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("whisper_tokenizer", sources / WHISPER_FILES[0])
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    encoding = module.get_encoding("multilingual", num_languages=WHISPER_LANGUAGES)
    return [token for token, _ in sorted(encoding._special_tokens.items(), key=lambda t: t[1])]


def write_whisper_tokenizer(target: Path, sources: Path) -> None:
    """Hugging Face's Whisper tokenizer (byte-level BPE) from the tiktoken vocabulary, by
    transformers' TikTokenConverter; the added tokens in openai-whisper's order (timestamps
    not special, as on the Hub, so that they follow every special id); prefix tokens set."""
    from tokenizers import AddedToken
    from transformers import WhisperTokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocabulary = str(sources / WHISPER_FILES[1])
    vocab, merges = TikTokenConverter(vocab_file=vocabulary).extract_vocab_merges_from_model(
        vocabulary
    )
    tokenizer = WhisperTokenizer(vocab=vocab, merges=merges)
    specials = whisper_specials(sources)
    added = [AddedToken(t, special=not t[2].isdigit(), normalized=False) for t in specials[1:]]
    tokenizer.add_tokens(added)
    tokenizer.set_prefix_tokens()  # the post-processor names tokens that exist only now
    assert len(tokenizer) == len(vocab) + len(specials), len(tokenizer)
    tokenizer.save_pretrained(target)


def build_whisper(target: Path) -> None:
    """whisper-tiny's layout (80 mel bins, 1,500 audio positions, 448 text positions, the
    real vocabulary and feature extractor) with a tiny random body (d_model 64, 2+2 layers):
    vLLM serves it for transcriptions and translations; its text is noise, its counts real."""
    import torch
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    write_whisper_tokenizer(target, whisper_sources(target.parent / ".downloads"))
    WhisperFeatureExtractor(feature_size=80).save_pretrained(target)
    torch.manual_seed(8)
    config = WhisperConfig(
        vocab_size=51865,
        num_mel_bins=80,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=1500,
        max_target_positions=448,
        pad_token_id=50257,
        bos_token_id=50257,
        eos_token_id=50257,
        decoder_start_token_id=50258,
    )
    model = WhisperForConditionalGeneration(config)
    model.config.architectures = ["WhisperForConditionalGeneration"]
    model.save_pretrained(target, safe_serialization=True)
    _patch_config(target)


# --- voxtral-realtime-tiny (issue #49) -------------------------------------------------

# vLLM serves /v1/realtime only for realtime models (Voxtral realtime, Qwen3-ASR realtime;
# Qwen3-ASR imports torchvision, which a CPU environment here cannot load). Voxtral
# realtime is served from Mistral-format files: tekken.json (the tokenizer, with its audio
# section) and params.json. The vocabulary is the Tekken one mistral_common ships
# (mistral_common/data/tekken_240911.json, a vLLM dependency from PyPI); these are its
# special tokens, in this order, for tokenizer version v13.
VOXTRAL_SPECIALS = (
    *("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"),
    *("[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]"),
    *("[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"),
    *("[TOOL_CONTENT]", "[ARGS]", "[CALL_ID]", "[AUDIO]", "[BEGIN_AUDIO]", "[TRANSCRIBE]"),
    *("[THINK]", "[/THINK]", "[STREAMING_PAD]", "[STREAMING_WORD]"),
)
# A streaming audio tokenizer: 12.5 audio tokens a second (80 ms, 1,280 samples each),
# 480 ms of delay, 32 tokens of left padding: each utterance's prompt is BOS + 32 + 6 = 39.
VOXTRAL_AUDIO = {
    "sampling_rate": 16000,
    "frame_rate": 12.5,
    "audio_encoding_config": {"num_mel_bins": 128, "hop_length": 160, "window_size": 400},
    "transcription_format": "streaming",
    "transcription_delay_ms": 480.0,
    "streaming_look_ahead_ms": 2.5,
    "streaming_look_back_ms": 52.5,
    "streaming_n_left_pad_tokens": 32,
}
VOXTRAL_ENCODER = {
    "audio_encoding_args": {
        "sampling_rate": 16000,
        "num_mel_bins": 128,
        "hop_length": 160,
        "window_size": 400,
        "global_log_mel_max": 1.5,
    },
    **{"dim": 64, "n_layers": 2, "hidden_dim": 128, "n_heads": 2, "head_dim": 32},
    **{"vocab_size": 131072, "causal": True, "sliding_window": 750, "pos_embed": "rope"},
    "max_source_positions": 1500,
}


def build_voxtral_realtime(target: Path) -> None:
    """voxtral-realtime-tiny: Voxtral realtime's layout (a causal Whisper encoder pooled 4:1
    into a small Mistral decoder, ``VoxtralRealtimeGeneration``) as params.json, and a
    streaming tekken.json. No weights are written: it is served with ``--load-format
    dummy`` (vLLM initialises the tiny body at random; ``scripts/vllm_cpu.REALTIME_ARGS``),
    its text is noise, its token counts real."""
    import mistral_common

    vocabulary = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
    tekken = json.loads(vocabulary.read_text())
    tekken.pop("image", None)
    tekken["config"]["version"] = "v13"
    tekken["special_tokens"] = [
        {"rank": rank, "token_str": token, "is_control": True}
        for rank, token in enumerate(VOXTRAL_SPECIALS)
    ]
    tekken["audio"] = VOXTRAL_AUDIO
    (target / "tekken.json").write_text(json.dumps(tekken))
    params = {
        **{"dim": 64, "n_layers": 2, "head_dim": 32, "hidden_dim": 128, "n_heads": 2},
        **{"n_kv_heads": 1, "rope_theta": 1e6, "norm_eps": 1e-5, "vocab_size": 131072},
        **{"tied_embeddings": True, "max_position_embeddings": 4096, "max_seq_len": 4096},
        "multimodal": {
            "whisper_model_args": {
                "encoder_args": VOXTRAL_ENCODER,
                "downsample_args": {"downsample_factor": 4},
            }
        },
    }
    (target / "params.json").write_text(json.dumps(params, indent=2))


# name -> builder(target); the BERT models also take the MiniLM directory.
FAMILY_BUILDERS = {
    "xlmr-ce-tiny": build_xlmr_ce,
    "xlmr-embed-tiny": build_xlmr_embed,
    "qwen3-embed-tiny": build_qwen3_embed,
    "qwen3-reranker-tiny": build_qwen3_reranker,
    "jina-v3-tiny": build_jina_v3,
    "modernbert-colbert-tiny": build_modernbert_colbert,
    "qwen3-gen-tiny": build_qwen3_generate,
    "whisper-tiny": build_whisper,
    "voxtral-realtime-tiny": build_voxtral_realtime,
}
MINILM_BUILDERS = {"cross-encoder-tiny": build_cross_encoder, "colbert-tiny": build_colbert}
NAMES = (*MINILM_BUILDERS, *FAMILY_BUILDERS)


def build(name: str, minilm: Path, out: Path) -> Path:
    target = out / name
    marker = target / MARKER
    # The BERT models' marker is empty (they predate BUILD_VERSION); the others carry it.
    wanted = "" if name in MINILM_BUILDERS else BUILD_VERSION
    if marker.exists() and marker.read_text().strip() == wanted:
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    if name in MINILM_BUILDERS:
        MINILM_BUILDERS[name](minilm, target)
    else:
        FAMILY_BUILDERS[name](target)
    marker.write_text(wanted)
    return target


def main() -> int:
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # deterministic tokenizer training
    minilm, out = Path(sys.argv[1]), Path(sys.argv[2])
    for name in sys.argv[3:] or NAMES:
        print(name, build(name, minilm, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
