"""LLM rerankers and jina-reranker-v3 are counted from the prompt vLLM renders, not
assumed (issue #30): the template a server runs with, rendered with the request's
``chat_template_kwargs``; jina's listwise prompt, checked against vLLM's own code."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from proxy.accounting.counts import jina_v3_prompt, recount, template_length
from proxy.accounting.types import Family, ScorePrompt, Truncation
from proxy.tokenizers.hf import HFTokenizer
from tests.support.bpe import train_qwen_like
from tests.support.profiles import profile

# A score template in the Qwen3-Reranker prompt format (roles query and document).
QWEN3_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the "
    'Query and the Instruct provided. Note that the answer can only be "yes" or "no".'
    "<|im_end|>\n<|im_start|>user\n<Instruct>: {{ instruction | default('Given a web search "
    "query, retrieve relevant passages that answer the query') }}\n"
    "<Query>: {{ messages[0]['content'] }}\n<Document>: {{ messages[1]['content'] }}"
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
Q = "What is the capital of France?"
D = "Paris is the capital of France.\n\nThe Eiffel Tower is in Paris."
NONE = Truncation()
JINA_029 = profile(Family.JINA_V3, "0.29.0", max_model_len=2048)
JINA_032 = profile(Family.JINA_V3, "0.32.0", max_model_len=2048)


@pytest.fixture(scope="module")
def raw() -> Any:
    return train_qwen_like()


@pytest.fixture(scope="module")
def qwen(raw: Any) -> HFTokenizer:
    return HFTokenizer(raw)


def rendered_length(raw: Any, q: str, d: str, **kwargs: Any) -> int:
    """The count as vLLM gets it: transformers renders, the tokenizer call counts."""
    messages = [{"role": "query", "content": q}, {"role": "document", "content": d}]
    text = raw.apply_chat_template(messages, chat_template=QWEN3_TEMPLATE, tokenize=False, **kwargs)
    return len(raw(text)["input_ids"])


def templated(
    version: str = "0.32.0", template: str | None = QWEN3_TEMPLATE, sep: bool = False
) -> Any:
    return profile(Family.TEMPLATE_RERANKER, version, prompt=ScorePrompt(template, None, sep))


def test_a_score_template_is_rendered_and_counted(raw: Any, qwen: HFTokenizer) -> None:
    counted = recount(qwen, [Q], [D, "Berlin."], NONE, templated())
    assert counted.document_lengths == (
        rendered_length(raw, Q, D),
        rendered_length(raw, Q, "Berlin."),
    )
    assert counted.engine == counted.prefix_reported == sum(counted.document_lengths)


def test_the_instruction_reaches_the_template_and_unknown_kwargs_do_not(
    raw: Any, qwen: HFTokenizer
) -> None:
    plain = template_length(qwen, Q, D, NONE, templated(), {})
    told = template_length(qwen, Q, D, NONE, templated(), {"instruction": "Find cities"})
    assert told == rendered_length(raw, Q, D, instruction="Find cities") != plain
    assert template_length(qwen, Q, D, NONE, templated(), {"colour": "blue"}) == plain


def test_texts_are_cut_before_the_template_and_the_prompt_after(
    raw: Any, qwen: HFTokenizer
) -> None:
    cut = Truncation(max_tokens_per_doc=3)
    short = template_length(qwen, Q, D, cut, templated(), {})
    first_three = D[: qwen.content_offsets(D)[2][1]]
    assert short == rendered_length(raw, Q, first_three)
    assert template_length(qwen, Q, D, Truncation(truncate_prompt_tokens=7), templated(), {}) == 7
    padded = Truncation(pad_to_max_length=True)
    assert template_length(qwen, Q, D, padded, templated(), {}) == 256


def test_without_a_template_the_two_texts_are_joined(raw: Any, qwen: HFTokenizer) -> None:
    """use_sep_token false (the seq-cls adapter): ``tokenizer(q + d)``; up to 0.30 a
    max_tokens_per_doc request joins the two texts' ids instead (no special tokens)."""
    joined = templated(template=None)
    assert template_length(qwen, Q, D, NONE, joined, {}) == len(raw(Q + D)["input_ids"])
    cut = Truncation(max_tokens_per_doc=3)
    q_ids = raw.encode(Q, add_special_tokens=False)
    assert template_length(qwen, Q, D, cut, templated("0.29.0", None), {}) == len(q_ids) + 3
    d_cut = D[: qwen.content_offsets(D)[2][1]]
    assert template_length(qwen, Q, D, cut, templated("0.31.0", None), {}) == len(
        raw(Q + d_cut)["input_ids"]
    )


def test_with_the_sep_token_the_pair_tokenizer_counts(raw: Any, qwen: HFTokenizer) -> None:
    paired = templated(template=None, sep=True)
    assert template_length(qwen, Q, D, NONE, paired, {}) == len(
        raw(text=Q, text_pair=D)["input_ids"]
    )


def test_jina_reranker_m0s_own_template_and_score_token(raw: Any, qwen: HFTokenizer) -> None:
    m0 = profile(Family.TEMPLATE_RERANKER, "0.32.0", prompt=ScorePrompt(None, "jina-vl"))
    text = f"**Document**:\n{D}\n**Query**:\n{Q}"
    assert template_length(qwen, Q, D, NONE, m0, {}) == len(raw(text)["input_ids"]) + 1
    assert template_length(qwen, Q, D, Truncation(truncate_prompt_tokens=5), m0, {}) == 5


def test_jina_v3_is_one_listwise_prompt_reported_n_times_before_the_fix(
    raw: Any, qwen: HFTokenizer
) -> None:
    docs = [D, "Berlin is in Germany."]
    counted = recount(qwen, [Q], docs, NONE, JINA_029)
    length = len(raw(jina_v3_prompt(Q, docs, None))["input_ids"])
    assert counted.document_lengths == (length,)
    assert (counted.engine, counted.prefix_reported) == (length, 2 * length)
    n_to_n = recount(qwen, [Q, Q], docs, NONE, JINA_029)
    assert (
        n_to_n.engine
        == n_to_n.prefix_reported
        == sum(len(raw(jina_v3_prompt(Q, [d], None))["input_ids"]) for d in docs)
    )
    told = recount(
        qwen,
        [Q],
        docs,
        NONE,
        JINA_032,
        {"instruction": "cities"},
    )
    assert told.engine == len(raw(jina_v3_prompt(Q, docs, "cities"))["input_ids"]) > length


def _vllm_io_processor(version: str) -> Path | None:
    from scripts.vllm_cpu import env_python

    python = env_python(version)
    if python is None:
        return None
    found = list(
        python.parent.parent.glob(
            "lib/python3*/site-packages/vllm/entrypoints/pooling/scoring/io_processor.py"
        )
    )
    return found[0] if found else None


@pytest.mark.parametrize("version", ["0.29.0", "0.32.0"])
def test_the_jina_v3_prompt_is_vllms_own(version: str) -> None:
    """The listwise prompt equals what the release's own ``format_docs_prompts_func``
    builds (read from the provisioned vLLM environment: ``make provision``)."""
    source = _vllm_io_processor(version)
    if source is None:
        pytest.skip(f"vLLM {version} is not provisioned (make provision)")
    found = re.search(
        r"    def format_docs_prompts_func\(.*?\n        return prefix \+ prompt \+ suffix\n",
        source.read_text(),
        re.S,
    )
    assert found is not None, "vLLM's jina prompt function moved: re-read its scoring code"
    namespace: dict[str, Any] = {}
    exec("from typing import *\n" + textwrap.dedent(found.group(0)), namespace)
    theirs = namespace["format_docs_prompts_func"]
    for query, docs, instruction in [
        (Q, [D, "b"], None),
        ("who<|rerank_token|>?", ["x <|embed_token|>y"], "be <|embed_token|>brief"),
        ("", [""], ""),
    ]:
        assert jina_v3_prompt(query, docs, instruction) == theirs(
            query, docs, instruction=instruction
        )
