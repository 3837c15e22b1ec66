"""Family detection from config.json, as vLLM's registry decides it."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.accounting.family import (
    Decision,
    ServedTasks,
    decide_family,
    detect_family,
    uses_sep_token,
)
from proxy.accounting.types import Family, ScorePrompt


@pytest.mark.parametrize(
    ("config", "family"),
    [
        ({"architectures": ["BertModel"], "model_type": "bert"}, Family.BI_ENCODER),
        ({"architectures": ["XLMRobertaModel"]}, Family.BI_ENCODER),
        ({"architectures": ["Qwen3ForCausalLM"]}, Family.BI_ENCODER),
        ({"architectures": ["HF_ColBERT"]}, Family.LATE_INTERACTION),
        ({"architectures": ["ColBERTModernBertModel"]}, Family.LATE_INTERACTION),
        ({"architectures": ["JinaForRanking"]}, Family.JINA_V3),
        (
            {
                "architectures": ["BertForSequenceClassification"],
                "model_type": "bert",
                "num_labels": 1,
            },
            Family.CROSS_ENCODER,
        ),
        (
            {
                "architectures": ["XLMRobertaForSequenceClassification"],
                "model_type": "xlm-roberta",
                "id2label": {"0": "LABEL_0"},
            },
            Family.CROSS_ENCODER,
        ),
        (
            {
                "architectures": ["Qwen3ForSequenceClassification"],
                "model_type": "qwen3",
                "num_labels": 1,
            },
            Family.TEMPLATE_RERANKER,
        ),
        (
            {
                "architectures": ["BertForSequenceClassification"],
                "model_type": "bert",
                "num_labels": 1,
                "use_sep_token": False,
            },
            Family.TEMPLATE_RERANKER,
        ),
        ({"architectures": ["BertForSequenceClassification"], "model_type": "bert"}, None),
        ({"architectures": ["BertForSequenceClassification"], "num_labels": 3}, None),
    ],
)
def test_detect_family(config: dict[str, Any], family: Family | None) -> None:
    """Architectures and label counts decide the family; multi-label classifiers cannot score."""
    assert detect_family(config) == family


QWEN3_CAUSAL = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
CLASSIFIER_ROUTES = ServedTasks.from_paths(["/classify", "/score", "/rerank", "/pooling"])
EMBED_ROUTES = ServedTasks.from_paths(["/v1/embeddings", "/score", "/rerank", "/pooling"])


def test_a_causal_checkpoint_served_as_a_classifier_is_a_template_reranker() -> None:
    """Issue #30: Qwen3-Reranker served with --hf-overrides. config.json says causal LM; the
    server's routes say classifier. Without the operator's template the decision says
    so loudly; with it, the prompt is that template."""
    guessed = decide_family(QWEN3_CAUSAL, CLASSIFIER_ROUTES)
    assert guessed.family is Family.TEMPLATE_RERANKER
    assert guessed.prompt == ScorePrompt(None, None, use_sep_token=False)  # the seq-cls adapter
    assert guessed.warning is not None
    assert "--chat-template" in guessed.warning
    assert not guessed.countable  # unaudited, billed as reported: never a guessed count
    told = decide_family(QWEN3_CAUSAL, CLASSIFIER_ROUTES, chat_template="{{ messages }}")
    assert told.family is Family.TEMPLATE_RERANKER
    assert told.prompt == ScorePrompt("{{ messages }}", None, use_sep_token=False)
    assert told.warning is None
    assert told.countable


def test_a_causal_checkpoint_served_for_embeddings_stays_a_bi_encoder() -> None:
    """Qwen3-Embedding's config says Qwen3ForCausalLM too; its server serves embeddings."""
    decision = decide_family(QWEN3_CAUSAL, EMBED_ROUTES)
    assert decision == Decision(Family.BI_ENCODER)


def test_without_the_servers_routes_a_causal_guess_is_flagged() -> None:
    decision = decide_family(QWEN3_CAUSAL, None)
    assert decision.family is Family.BI_ENCODER
    assert decision.warning is not None
    assert "family" in decision.warning


def test_a_bert_checkpoint_served_as_a_classifier_is_a_cross_encoder() -> None:
    config = {"architectures": ["BertModel"], "model_type": "bert"}
    assert decide_family(config, CLASSIFIER_ROUTES).family is Family.CROSS_ENCODER


def test_a_classifier_converted_to_embeddings_is_a_bi_encoder() -> None:
    config = {
        "architectures": ["BertForSequenceClassification"],
        "model_type": "bert",
        "num_labels": 1,
    }
    assert decide_family(config, EMBED_ROUTES).family is Family.BI_ENCODER
    assert decide_family(config, CLASSIFIER_ROUTES).family is Family.CROSS_ENCODER


def test_jina_reranker_m0_has_its_own_template_and_one_label() -> None:
    """vLLM forces one label on JinaVLForRanking; its config.json has no num_labels."""
    decision = decide_family(
        {"architectures": ["JinaVLForRanking"], "model_type": "qwen2_vl"}, None
    )
    assert decision.family is Family.TEMPLATE_RERANKER
    assert decision.prompt is not None
    assert decision.prompt.builtin == "jina-vl"


@pytest.mark.parametrize(
    ("config", "sep"),
    [
        ({}, True),
        ({"use_sep_token": False}, False),
        ({"use_pad_token": False, "use_sep_token": True}, False),  # deprecated key first
        ({"method": "from_2_way_softmax", "classifier_from_token": ["no", "yes"]}, False),
    ],
)
def test_uses_sep_token_as_vllm_decides(config: dict[str, Any], sep: bool) -> None:
    assert uses_sep_token(config) is sep


def test_the_operators_family_wins() -> None:
    decision = decide_family(QWEN3_CAUSAL, None, family=Family.TEMPLATE_RERANKER, chat_template="t")
    assert decision.family is Family.TEMPLATE_RERANKER
    assert decision.prompt == ScorePrompt("t", None, use_sep_token=False)
    assert decision.warning is None
