"""Decide a model's scoring family from its ``config.json``, the way vLLM's registry does."""

from __future__ import annotations

from typing import Any

from proxy.accounting.types import Family

JINA_V3_ARCHITECTURES = frozenset({"JinaForRanking"})
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
    if LATE_INTERACTION_ARCHITECTURES.intersection(architectures):
        return Family.LATE_INTERACTION
    if any(a.endswith(("ForSequenceClassification", "ForRanking")) for a in architectures):
        if _num_labels(config) != 1:
            return None
        pair = config.get("model_type") in PAIR_TOKENIZER_MODEL_TYPES
        if pair and config.get("use_sep_token", True):
            return Family.CROSS_ENCODER
        return Family.TEMPLATE_RERANKER
    return Family.BI_ENCODER


def is_generative(config: dict[str, Any]) -> bool:
    """vLLM's default runner for this architecture generates text (a causal or
    conditional-generation LM), so /invocations tries chat and completions first."""
    architectures = [str(a) for a in config.get("architectures") or []]
    return any(a.endswith(("ForCausalLM", "ForConditionalGeneration")) for a in architectures)
