"""Engine-level accounting against the spec's measured numbers, with the real tokenizer."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.accounting.counts import (
    count_request,
    cut_text,
    derive_engine,
    jina_v3_prompt,
    recount,
    single_lengths,
    template_length,
)
from proxy.accounting.types import Family, Pairing, ScorePrompt, Truncation
from proxy.tokenizers.hf import HFTokenizer
from tests.support.bpe import train_qwen_like
from tests.support.profiles import profile
from tests.support.texts import DOCS, QUERY

NONE = Truncation()


def test_worked_example_one_to_n(minilm: HFTokenizer) -> None:
    """Spec 5: 1:3 rerank, 0.29.0 reports 57 while the engine encoded 36 (9 + 9 + 11 + 7)."""
    counted = recount(minilm, [QUERY], DOCS, NONE, profile())
    assert counted is not None
    assert counted.query_lengths == (9,)
    assert counted.document_lengths == (9, 11, 7)
    assert (counted.engine, counted.prefix_reported) == (36, 57)


def test_worked_example_one_to_one(minilm: HFTokenizer) -> None:
    """Spec 5: 1:1 with the first document: 0.29.0 reports 19, the engine encoded 18."""
    counted = recount(minilm, [QUERY], DOCS[:1], NONE, profile())
    assert counted is not None
    assert (counted.engine, counted.prefix_reported) == (18, 19)


def test_cross_encoder_pairs(minilm: HFTokenizer) -> None:
    """Spec 5: a BERT cross-encoder with the MiniLM tokenizer reports 51 = 17 + 19 + 15."""
    counted = recount(minilm, [QUERY], DOCS, NONE, profile(Family.CROSS_ENCODER))
    assert counted is not None
    assert counted.document_lengths == (17, 19, 15)
    assert counted.engine == counted.prefix_reported == 51


def test_n_to_n_adds_one_pad_per_pair(minilm: HFTokenizer) -> None:
    """N:N pre-fix reports sum Q + sum D + N*p."""
    queries = [QUERY, "Where is Berlin?"]
    counted = recount(minilm, queries, DOCS[:2], NONE, profile())
    assert counted is not None
    q = sum(counted.query_lengths)
    assert counted.engine == q + 9 + 11
    assert counted.prefix_reported == counted.engine + 2


def test_no_pad_token_means_no_separator(minilm: HFTokenizer) -> None:
    """With p = 0 a 1:N report only repeats the query."""
    counted = recount(minilm, [QUERY], DOCS, NONE, profile(pad=False))
    assert counted is not None
    assert counted.prefix_reported == 3 * 9 + 27


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_inputs_are_two_tokens(minilm: HFTokenizer, text: str) -> None:
    """An empty or whitespace-only input is [CLS] [SEP]."""
    assert single_lengths(minilm, [text], NONE, 256) == [2]


@pytest.mark.parametrize(
    ("trunc", "expected"),
    [
        (Truncation(truncate_prompt_tokens=5), [5, 5, 5]),
        (Truncation(truncate_prompt_tokens=10), [9, 10, 7]),
        (Truncation(truncate_prompt_tokens=-1), [9, 11, 7]),
        (Truncation(truncate_prompt_tokens=8, truncation_side="left"), [8, 8, 7]),
        (Truncation(truncate_prompt_tokens=8, truncation_side="right"), [8, 8, 7]),
        (Truncation(truncate_prompt_tokens=1), [1, 1, 1]),
        (Truncation(truncate_prompt_tokens=0), [0, 0, 0]),
        (Truncation(pad_to_max_length=True), [256, 256, 256]),
        (Truncation(truncate_prompt_tokens=4, pad_to_max_length=True), [256, 256, 256]),
    ],
)
def test_single_lengths_truncation_table(
    minilm: HFTokenizer, trunc: Truncation, expected: list[int]
) -> None:
    """truncate_prompt_tokens keeps k tokens per input; padding fills to max_model_len."""
    assert single_lengths(minilm, DOCS, trunc, 256) == expected


def test_too_long_without_truncation_is_visible(minilm: HFTokenizer) -> None:
    """Beyond max_model_len the count exceeds it (vLLM answers 400; nothing is billed)."""
    (length,) = single_lengths(minilm, ["word " * 400], NONE, 256)
    assert length > 256


def test_cut_text_single_pass_and_iterative(minilm: HFTokenizer) -> None:
    """max_tokens_per_* cuts raw text to k content tokens (ASCII: both algorithms agree)."""
    text = "The capital of France is Paris. " * 3
    for iterative in (False, True):
        cut = cut_text(minilm, text, 4, iterative=iterative)
        assert cut == "The capital of France"
        assert len(minilm.content_offsets(cut)) == 4


def test_cut_text_iterative_never_exceeds_limit(minilm: HFTokenizer) -> None:
    """0.31+ iterates until the text has at most k content tokens, even for Hangul."""
    text = "안녕하세요 세계 여러분 반갑습니다"
    for k in range(1, 8):
        cut = cut_text(minilm, text, k, iterative=True)
        assert len(minilm.content_offsets(cut)) <= k


def test_vllm_reference_figures_shape(minilm: HFTokenizer) -> None:
    """Spec 5 reference request: limits of 10 cut query and document to 10 content tokens."""
    query = "What is the capital of France?" * 20
    doc = "The capital of France is Paris. " * 20
    both = Truncation(max_tokens_per_query=10, max_tokens_per_doc=10)
    counted = recount(minilm, [query], [doc], both, profile(version="0.32.0"))
    assert counted is not None
    assert counted.engine == 24
    assert counted.prefix_reported == 25


def test_count_request_derivation_inputs(minilm: HFTokenizer) -> None:
    """With an image document only the query is counted, enough for the derivation."""
    image = {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
    counted = count_request(minilm, [QUERY], [image, DOCS[0]], NONE, profile())
    assert counted.recount is None
    assert counted.query_length == 9


@pytest.mark.parametrize("pairing", list(Pairing))
def test_derive_engine_inverts_the_inflation(minilm: HFTokenizer, pairing: Pairing) -> None:
    """E = R - (N-1)Q - Np (1:N), R - Np (N:N), R - p (1:1) recovers the recount."""
    queries = [QUERY, "Where?", "Who?"] if pairing is Pairing.N_TO_N else [QUERY]
    docs = DOCS[:1] if pairing is Pairing.ONE_TO_ONE else DOCS
    counted = recount(minilm, queries, docs, NONE, profile())
    assert counted is not None
    derived = derive_engine(counted.prefix_reported, pairing, len(docs), 9, True)
    assert derived == counted.engine


texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    query=texts,
    docs=st.lists(texts, min_size=1, max_size=5),
    keep=st.one_of(st.none(), st.integers(min_value=-1, max_value=40)),
    pad=st.booleans(),
)
def test_engine_never_exceeds_prefix_report(
    minilm: HFTokenizer, query: str, docs: list[str], keep: int | None, pad: bool
) -> None:
    """Property: E <= pre-fix R, and the derivation from R and Q gives back E."""
    trunc = Truncation(truncate_prompt_tokens=keep)
    counted = recount(minilm, [query], docs, trunc, profile(pad=pad))
    assert counted is not None
    assert counted.engine <= counted.prefix_reported
    pairing = Pairing.ONE_TO_ONE if len(docs) == 1 else Pairing.ONE_TO_N
    q = counted.query_lengths[0]
    assert derive_engine(counted.prefix_reported, pairing, len(docs), q, pad) == counted.engine


def test_padding_ignored_before_0_29_is_counted_as_the_engine_does(minilm: HFTokenizer) -> None:
    """With 0.28.0 the 1:1 padded request is billed at the unpadded engine count."""
    from proxy.accounting.counts import count_request

    old = profile(version="0.28.0")
    trunc = old.release.applied(Truncation(pad_to_max_length=True))
    counted = count_request(minilm, [QUERY], [DOCS[0]], trunc, old)
    assert counted.recount is not None
    assert counted.recount.engine == 9 + 9  # no padding to 256


def test_from_0_33_only_second_needs_room_for_the_document(minilm: HFTokenizer) -> None:
    """vLLM 0.33 skips the ``only_second`` cut when the query and the special tokens
    already fill the limit (issue #30): the pair is then truncated as any pair is, to
    ``truncate_prompt_tokens``; with room left, every release cuts the document alone."""
    crowded = Truncation(truncate_prompt_tokens=8, max_tokens_per_doc=2)
    counted = recount(minilm, [QUERY], DOCS[:1], crowded, profile(Family.CROSS_ENCODER, "0.33.0"))
    assert counted.document_lengths == (8,)
    roomy = Truncation(max_tokens_per_doc=2)
    for version in ("0.32.0", "0.33.0"):
        counted = recount(minilm, [QUERY], DOCS[:1], roomy, profile(Family.CROSS_ENCODER, version))
        assert counted.document_lengths == (9 + 2 + 3 - 2,)  # [CLS] q [SEP] d[:2] [SEP]


# LLM rerankers and jina-reranker-v3 are counted from the prompt vLLM renders, not assumed
# (issue #30): the template a server runs with, rendered with the request's
# chat_template_kwargs; jina's listwise prompt, checked against vLLM's own code.

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


def test_a_template_with_loop_controls_is_rendered_as_transformers_renders_it(
    raw: Any, qwen: HFTokenizer
) -> None:
    """transformers enables jinja's loop controls (``{% break %}``); the proxy's reading
    of the template's variables does too, so the instruction still reaches it."""
    template = (
        "{% for m in messages %}{{ m['content'] }}{% if loop.first %}{% break %}{% endif %}"
        "{% endfor %}|{{ instruction }}"
    )
    prompt = templated(template=template)
    messages = [{"role": "query", "content": Q}, {"role": "document", "content": D}]
    text = raw.apply_chat_template(
        messages, chat_template=template, tokenize=False, instruction="cities"
    )
    assert template_length(qwen, Q, D, NONE, prompt, {"instruction": "cities"}) == len(
        raw(text)["input_ids"]
    )
    assert text.endswith("|cities")


def test_a_jina_token_hidden_in_another_survives_one_pass_only() -> None:
    """``<|rerank_<|embed_token|>token|>`` keeps a rerank token after 0.33's one pass and
    loses it in 0.34's passes until nothing changes: the prompts differ by that token."""
    query = "a <|rerank_<|embed_token|>token|> b"
    once = jina_v3_prompt(query, ["d"], None)
    repeated = jina_v3_prompt(query, ["d"], None, repeat=True)
    assert "query: a <|rerank_token|> b" in once
    assert "query: a  b" in repeated
