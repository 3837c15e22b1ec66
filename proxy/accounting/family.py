"""Decide a model's scoring family from its ``config.json``, the way vLLM's registry does,
and from what the server says it serves (its routes), which ``config.json`` cannot show."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from proxy.accounting.types import Family, ScorePrompt

JINA_V3_ARCHITECTURES = frozenset({"JinaForRanking"})
# Rerankers with their own score template in vLLM (``get_score_template``), one label forced.
BUILTIN_TEMPLATE_ARCHITECTURES: dict[str, Literal["jina-vl"]] = {"JinaVLForRanking": "jina-vl"}
LATE_INTERACTION_ARCHITECTURES = frozenset(
    {
        "HF_ColBERT",
        "ColBERTModernBertModel",
        "ColBERTJinaRobertaModel",
        "ColBERTLfm2Model",
        "ColModernVBertForRetrieval",
        "ColPaliForRetrieval",
        "ColQwen3",
        "OpsColQwen3Model",
        "ColQwen3_5",
        "Qwen3VLNemotronEmbedModel",
    }
)
# Encoder families whose pair tokenizer vLLM calls as tok(text=q, text_pair=d).
PAIR_TOKENIZER_MODEL_TYPES = frozenset(
    {
        "bert",
        "roberta",
        "xlm-roberta",
        "modernbert",
        "electra",
        "distilbert",
        "deberta-v2",
        "new",
        "nomic_bert",
        "gte",
    }
)


def _num_labels(config: dict[str, Any]) -> int:
    if "num_labels" in config:
        return int(config["num_labels"])
    id2label = config.get("id2label")
    return len(id2label) if isinstance(id2label, dict) and id2label else 2


def detect_family(config: dict[str, Any]) -> Family | None:
    """The family of a model config, or None when it cannot serve the score API.

    Mirrors vLLM: late-interaction architectures (ColBERT, JinaForRanking) use token
    embeddings; a sequence classifier with one label is a cross-encoder (a plain pair
    tokenizer for BERT-like encoders, a prompt template for LLM rerankers); anything
    else served as a pooling model embeds, i.e. is a bi-encoder.
    """
    architectures = [str(a) for a in config.get("architectures") or []]
    if JINA_V3_ARCHITECTURES.intersection(architectures):
        return Family.JINA_V3
    if BUILTIN_TEMPLATE_ARCHITECTURES.keys() & set(architectures):
        return Family.TEMPLATE_RERANKER
    if LATE_INTERACTION_ARCHITECTURES.intersection(architectures):
        return Family.LATE_INTERACTION
    if any(a.endswith(("ForSequenceClassification", "ForRanking")) for a in architectures):
        if _num_labels(config) != 1:
            return None
        pair = config.get("model_type") in PAIR_TOKENIZER_MODEL_TYPES
        if pair and uses_sep_token(config):
            return Family.CROSS_ENCODER
        return Family.TEMPLATE_RERANKER
    return Family.BI_ENCODER


def uses_sep_token(config: dict[str, Any], converted: bool = False) -> bool:
    """vLLM's ``ModelConfig.use_sep_token``: ``use_pad_token`` (deprecated) or
    ``use_sep_token`` from the config; else False for an LLM turned into a classifier from
    its ``classifier_from_token`` (``method``), as vLLM's seq-cls adapter sets it, else True.
    ``converted``: the server turned it into one (``--hf-overrides``), which the file on
    disk does not show."""
    for key in ("use_pad_token", "use_sep_token"):
        if key in config:
            return bool(config[key])
    return not (converted or "method" in config or "classifier_from_token" in config)


@dataclass(frozen=True, slots=True)
class ServedTasks:
    """What the server's own router serves (its ``/openapi.json``): vLLM registers the
    routes of the tasks the model supports (0.20 and later), so they tell how the model is
    served where ``config.json`` cannot (``--hf-overrides``, ``--convert``)."""

    embed: bool
    classify: bool
    generate: bool

    @classmethod
    def from_paths(cls, paths: Iterable[str]) -> ServedTasks:
        served = set(paths)
        return cls(
            embed="/v1/embeddings" in served,
            classify="/classify" in served,
            generate=bool({"/v1/chat/completions", "/v1/completions"} & served),
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """A model's family, how its prompt is built, and what the operator must be told."""

    family: Family | None
    prompt: ScorePrompt | None = None
    warning: str | None = None
    countable: bool = True  # False: how the engine builds its inputs cannot be known


def decide_family(
    config: dict[str, Any],
    served: ServedTasks | None,
    *,
    family: Family | None = None,
    chat_template: str | None = None,
    use_sep_token: bool | None = None,
) -> Decision:
    """The family vLLM serves a model as: ``config.json`` as its registry reads it,
    corrected by what the server serves. ``family``, ``chat_template``, ``use_sep_token``:
    the operator's per-model settings, which win (the server's ``--chat-template`` and
    ``--hf-overrides`` cannot be seen)."""
    if family is not None:  # a causal checkpoint scored with is converted (--hf-overrides)
        converted = is_generative(config)
        return Decision(family, _prompt(family, config, chat_template, use_sep_token, converted))
    family = detect_family(config)
    architectures = ", ".join(str(a) for a in config.get("architectures") or [])
    causal = is_generative(config)
    converted = False
    if family is Family.BI_ENCODER and served is not None and served.classify and not served.embed:
        # a classifier the checkpoint does not say it is (--hf-overrides, --convert classify)
        converted = True
        pair = config.get("model_type") in PAIR_TOKENIZER_MODEL_TYPES and not causal
        family = Family.CROSS_ENCODER if pair else Family.TEMPLATE_RERANKER
    elif (
        family in (Family.CROSS_ENCODER, Family.TEMPLATE_RERANKER)
        and served is not None
        and served.embed
        and not served.classify
    ):  # --convert embed
        family = Family.BI_ENCODER
    warning, countable = None, True
    if family is Family.TEMPLATE_RERANKER and causal and chat_template is None:
        # users serve these with --chat-template, which the proxy cannot see
        countable = False
        warning = (
            f"the checkpoint says {architectures} but the server scores with it as a "
            "classifier (--hf-overrides), with a score template the proxy cannot see: "
            "every request is unaudited, billed as reported; set this model's `template` "
            "to the file given to --chat-template (or its `family` to template-reranker if "
            "the server runs without one)"
        )
    elif family is Family.BI_ENCODER and causal and served is None:
        warning = (
            f"the checkpoint says {architectures} and the server does not say how it serves "
            "it (no /openapi.json): counted as an embedding model; if it is a reranker "
            "served with --hf-overrides, set this model's `family` and `template`"
        )
    prompt = _prompt(family, config, chat_template, use_sep_token, converted)
    return Decision(family, prompt, warning, countable)


def _prompt(
    family: Family | None,
    config: dict[str, Any],
    chat_template: str | None,
    use_sep_token: bool | None,
    converted: bool,
) -> ScorePrompt | None:
    """How a template reranker's prompt is built (None for the other families)."""
    if family is not Family.TEMPLATE_RERANKER:
        return None
    builtin = next(
        (
            BUILTIN_TEMPLATE_ARCHITECTURES[str(a)]
            for a in config.get("architectures") or []
            if str(a) in BUILTIN_TEMPLATE_ARCHITECTURES
        ),
        None,
    )
    sep = uses_sep_token(config, converted) if use_sep_token is None else use_sep_token
    return ScorePrompt(chat_template, builtin, sep)


def is_generative(config: dict[str, Any]) -> bool:
    """vLLM's default runner for this architecture generates text (a causal or
    conditional-generation LM), so /invocations tries chat and completions first."""
    architectures = [str(a) for a in config.get("architectures") or []]
    return any(a.endswith(("ForCausalLM", "ForConditionalGeneration")) for a in architectures)
