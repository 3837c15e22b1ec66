"""The field table's rows for the pooling operations: score, rerank, embeddings, classify
and pooling (``fields`` joins every operation's)."""

from __future__ import annotations

from proxy.accounting.fieldkinds import (
    CHAT_PROMPT,
    CONVERSATIONS,
    DOCUMENTS_ECHO,
    MODEL,
    POOLING_OUTPUT,
    PRIORITY,
    PROMPT,
    PROMPT_SHAPING,
    PROMPTS_EACH,
    REQUEST_ID,
    SALT,
    SCORE_SHAPE,
    UNREAD,
    table,
)
from proxy.accounting.operations import Operation

SCORE = table(
    Operation.SCORE,
    MODEL("model"),
    POOLING_OUTPUT("activation", "padding", "softmax", "use_activation"),
    PRIORITY("priority"),
    PROMPT("data_1", "data_2", "documents", "instruction", "items", "queries", "text_1", "text_2"),
    PROMPT_SHAPING(
        "chat_template_kwargs",
        "max_tokens_per_doc",
        "max_tokens_per_query",
        "mm_processor_kwargs",
        "truncate_prompt_tokens",
        "truncation_side",
    ),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    UNREAD("additional_data", "user"),
)


RERANK = table(
    Operation.RERANK,
    DOCUMENTS_ECHO("documents"),
    MODEL("model"),
    POOLING_OUTPUT("activation", "padding", "softmax", "use_activation"),
    PRIORITY("priority"),
    PROMPT("instruction", "query"),
    PROMPT_SHAPING(
        "chat_template_kwargs",
        "max_tokens_per_doc",
        "max_tokens_per_query",
        "mm_processor_kwargs",
        "truncate_prompt_tokens",
        "truncation_side",
    ),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    SCORE_SHAPE("top_n"),
    UNREAD("additional_data", "user"),
)


EMBEDDINGS = table(
    Operation.EMBEDDINGS,
    CHAT_PROMPT("add_generation_prompt", "chat_template", "continue_final_message"),
    CONVERSATIONS("messages"),
    MODEL("model"),
    POOLING_OUTPUT(
        "dimensions",
        "embed_dtype",
        "embedding_types",
        "encoding_format",
        "endianness",
        "late_chunking_params",
        "normalize",
        "output_dimension",
        "padding",
        "use_activation",
    ),
    PRIORITY("priority"),
    PROMPT("input", "input_type"),
    PROMPTS_EACH("images", "inputs", "texts"),
    PROMPT_SHAPING(
        "add_special_tokens",
        "chat_template_kwargs",
        "max_tokens",
        "media_io_kwargs",
        "mm_processor_kwargs",
        "truncate",
        "truncate_prompt_tokens",
        "truncation_side",
    ),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    UNREAD("additional_data", "user"),
)


CLASSIFY = table(
    Operation.CLASSIFY,
    CHAT_PROMPT("add_generation_prompt", "chat_template", "continue_final_message", "messages"),
    MODEL("model"),
    POOLING_OUTPUT("activation", "padding", "softmax", "use_activation"),
    PRIORITY("priority"),
    PROMPT("input"),
    PROMPT_SHAPING(
        "add_special_tokens",
        "chat_template_kwargs",
        "media_io_kwargs",
        "mm_processor_kwargs",
        "truncate_prompt_tokens",
        "truncation_side",
    ),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    UNREAD("user"),
)


POOLING = table(
    Operation.POOLING,
    CHAT_PROMPT("add_generation_prompt", "chat_template", "continue_final_message", "messages"),
    MODEL("model"),
    POOLING_OUTPUT(
        "activation",
        "dimensions",
        "embed_dtype",
        "encoding_format",
        "endianness",
        "normalize",
        "padding",
        "softmax",
        "task",
        "use_activation",
    ),
    PRIORITY("priority"),
    PROMPT("data", "input"),
    PROMPT_SHAPING(
        "add_special_tokens",
        "chat_template_kwargs",
        "media_io_kwargs",
        "mm_processor_kwargs",
        "truncate_prompt_tokens",
        "truncation_side",
    ),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    UNREAD("additional_data", "user"),
)
