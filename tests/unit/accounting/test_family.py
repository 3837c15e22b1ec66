"""Family detection from config.json, as vLLM's registry decides it."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.accounting.family import detect_family
from proxy.accounting.types import Family


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
