"""Model knowledge, discovered: upstream version and served models, tokenizers and families.

Owns its AppKey and a cleanup_ctx with the background refresh task. The sidecar may start
before vLLM is ready, so discovery retries quickly until it first succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict

from proxy.accounting.analysis import Analysis
from proxy.accounting.dispatch import model_task
from proxy.accounting.family import Decision, ServedTasks, decide_family, is_generative
from proxy.accounting.types import PROVEN_TEXT, EngineProfile, Release, ServedModel
from proxy.serving.upstream import SESSION, UpstreamError, get_json
from proxy.settings import ModelOverride, Settings
from proxy.tokenizers.cache import CountCache
from proxy.tokenizers.hf import HFTokenizer, load_tokenizer, model_file
from proxy.tokenizers.pool import TokenizerPool
from proxy.wire.jsonio import top_members

log = structlog.get_logger("proxy.serving.catalog")

# source, and whether to count as transformers 4.x does (see load_tokenizer)
TokenizerLoader = Callable[[str, bool], HFTokenizer]
_RETRY_SECONDS = 2.0


def read_model_config(source: str) -> dict[str, Any] | None:
    """``config.json`` of a local model directory or of an HF id in the local cache."""
    path = model_file(source, "config.json")
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def missing_directory(source: str, name: str, *, overridden: bool) -> str | None:
    """Why a tokenizer source that is a file-system path cannot be used, or None (an HF id,
    or a directory that exists). Said before anything else: advice about config.json or
    the family does not help when the directory is not there."""
    path = Path(source).expanduser()
    if not (path.is_absolute() or source.startswith(("./", "../", "~"))) or path.is_dir():
        return None
    if overridden:
        return (
            f"models.{name}.tokenizer: {source} is not a directory in the proxy's container; "
            "fix the path or mount the model there"
        )
    return (
        f"model directory {source} (root in /v1/models) is not in the proxy's container; "
        f"mount vLLM's model volume at the same path, or set models.{name}.tokenizer"
    )


def discovery_problem(base: str, exc: UpstreamError) -> str:
    """Why discovery failed, with the usual fix when ``--upstream`` names vLLM's /v1."""
    problem = f"discovery failed: {exc.message}"
    if base.rstrip("/").endswith("/v1"):
        root = base.rstrip("/")[: -len("/v1")]
        problem += (
            f"; --upstream {base} ends in /v1: give vLLM's root ({root}), the proxy keeps "
            "each request's own path"
        )
    return problem


def family_decision(
    config: dict[str, Any] | None, served: ServedTasks | None, override: ModelOverride | None
) -> Decision:
    """The model's family and prompt: the operator's per-model settings, else its config
    as vLLM reads it, corrected by what the server serves."""
    template = None
    if override is not None and override.template is not None:
        template = override.template.read_text(encoding="utf-8")
    family = override.family if override else None
    sep = override.use_sep_token if override else None
    if config is None:
        if family is None:
            return Decision(None)
        config = {}
    return decide_family(config, served, family=family, chat_template=template, use_sep_token=sep)


def build_model(
    entry: dict[str, Any],
    release: Release,
    override: ModelOverride | None,
    loader: TokenizerLoader,
    served: ServedTasks | None = None,
    transformers_4: bool = False,
) -> ServedModel:
    """Resolve the tokenizer and family of one ``/v1/models`` entry (blocking: files)."""
    name = str(entry.get("id"))
    root = str(entry.get("root") or name)
    max_model_len = int(entry.get("max_model_len") or 0)
    source = (override.tokenizer if override else None) or root

    missing = missing_directory(source, name, overridden=bool(override and override.tokenizer))
    if missing is not None:
        return ServedModel(name, root, max_model_len, None, None, missing)
    config = read_model_config(source)
    try:
        decision = family_decision(config, served, override)
    except OSError as exc:
        return ServedModel(name, root, max_model_len, None, None, f"template unreadable: {exc}")
    family = decision.family
    if decision.warning is not None:
        log.warning("model_served_unlike_its_checkpoint", model=name, problem=decision.warning)
    generates = (
        served.generate if served is not None else config is not None and is_generative(config)
    )
    task = model_task(family, generates=generates)

    def broken(problem: str) -> ServedModel:
        return ServedModel(name, root, max_model_len, None, None, problem, task)

    if max_model_len <= 0:
        return broken("upstream did not report max_model_len")
    if not decision.countable:
        return broken(decision.warning or "the engine's inputs cannot be known")
    if family is None:
        if config is None and served is not None and not (served.embed or served.classify):
            # Nothing to audit: the server scores nothing with it (a Mistral-format model
            # such as Voxtral has params.json, no config.json); its usage is metered as sent.
            return ServedModel(name, root, max_model_len, None, None, task=task)
        if config is None:
            return broken(f"no readable config.json at {source}; set models.{name}.family")
        return broken("model has no score API (classifier with more than one label)")
    try:
        tokenizer = loader(source, transformers_4)
    except Exception as exc:  # any loader failure leaves the model unaudited, never down
        return broken(f"tokenizer not loadable from {source}: {type(exc).__name__}: {exc}")
    profile = EngineProfile(
        family, max_model_len, tokenizer.pad_token_id is not None, release, decision.prompt
    )
    return ServedModel(name, root, max_model_len, profile, tokenizer, task=task)


async def served_tasks(session: aiohttp.ClientSession, base: str) -> ServedTasks | None:
    """What the upstream's router serves (its ``/openapi.json``), or None when it does
    not say (an older release, docs turned off, another server)."""
    try:
        spec = await get_json(session, f"{base}/openapi.json")
    except UpstreamError:
        return None
    paths = spec.get("paths") if isinstance(spec, dict) else None
    return ServedTasks.from_paths(paths) if isinstance(paths, dict) else None


def warn_if_unproven(release: Release) -> None:
    """Once per release seen: say when it is outside what the proxy proved on a real engine."""
    if release.proven is False:
        fixed = release.reports_engine_usage
        log.warning(
            "release_outside_proven_range",
            upstream_version=release.version,
            proven=PROVEN_TEXT,
            assumes="usage is engine-level: numbers are checked, never changed"
            if fixed
            else "pre-fix inflation per the release table: only proven corrections change a "
            "number; anything else is billed as reported and flagged mismatch",
        )


def _semantics(model: ServedModel, release: Release, pinned: str) -> str | None:
    """Which tokenizer library behaviour the model is counted with, and why."""
    if not isinstance(model.tokenizer, HFTokenizer):
        return None
    why = f"--upstream-transformers {pinned}" if pinned != "auto" else f"vLLM {release.version}"
    return f"{model.tokenizer.semantics}, as {why} runs"


def _prompt_source(model: ServedModel) -> str | None:
    """How a template reranker's prompt is counted, for the discovery log line."""
    prompt = model.profile.prompt if model.profile else None
    if prompt is None:
        return None
    if prompt.chat_template is not None:
        return "the configured score template"
    if prompt.builtin is not None:
        return f"the model's own score template ({prompt.builtin})"
    return "the pair tokenizer" if prompt.use_sep_token else "the two texts joined"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Any = None


class Catalog:
    """The upstream's version and models; refreshed in the background."""

    def __init__(
        self,
        settings: Settings,
        *,
        loader: TokenizerLoader = lambda source, legacy: load_tokenizer(
            source, transformers_4=legacy
        ),
        pool: TokenizerPool | None = None,
    ) -> None:
        self._settings = settings
        self._loader = loader
        self._pool = pool
        size = settings.count_cache_size
        self.cache = CountCache(size) if size else None
        self.release = Release(None)
        self.models: dict[str, ServedModel] = {}
        self._served: ServedTasks | None = None
        self.last_success: float | None = None
        # Why the last discovery failed (None after a success), and whether the upstream
        # answered it: then waiting for the next attempt cannot help a request.
        self.problem: str | None = None
        self._refused = False
        self.ready = asyncio.Event()
        self._lock = asyncio.Lock()

    async def wait_ready(self, within: float) -> bool:
        """Wait (bounded) for the first successful discovery; True once it has happened.
        No wait when the upstream answered discovery with an error (e.g. 404 for an
        --upstream ending in /v1): the next attempt would get the same answer."""
        if not self.ready.is_set() and not self._refused:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    await self.ready.wait()
        return self.ready.is_set()

    def lookup(self, name: str | None) -> ServedModel | None:
        """The served model a request names. Omitted, null or ``""`` mean vLLM's default:
        the first served name (with ``--served-model-name a b`` both name one model)."""
        if not name:
            return next(iter(self.models.values()), None)
        return self.models.get(name)

    def priced_as(self, name: str | None) -> ServedModel | None:
        """The model a request is priced by: the served one it names, else (a name not
        listed at the last discovery) a stand-in of the widest served context with no
        tokenizer. An adapter loaded since runs in the engine's context, and vLLM answers
        a name it does not serve with a 404 that settles to nothing; None: none known."""
        served = self.lookup(name)
        if served is not None or not name:
            return served
        widest = max((m.max_model_len for m in self.models.values()), default=0)
        if widest <= 0:
            return None
        return ServedModel(name, name, widest, None, None, "not listed at the last discovery")

    def stand_in_for(self, analysis: Analysis | None) -> tuple[Analysis | None, bool]:
        """``analysis`` with the model it is priced by: one naming a model the last
        discovery did not list is bounded as the widest model served (``priced_as``);
        and whether it is."""
        if analysis is None or analysis.model is not None or analysis.request is None:
            return analysis, False
        widest = self.priced_as(analysis.request.model)
        return (replace(analysis, model=widest), True) if widest else (analysis, False)

    def serves(self, name: str) -> bool:
        """Whether ``name`` is a model the upstream serves (as last discovered)."""
        return name in self.models

    def task_of(self, name: str | None) -> str | None:
        model = self.lookup(name)
        return model.task if model else None

    def model_name(self, name: str | None) -> str | None:
        """The served name a request is billed under (the default's name when it names none)."""
        model = self.lookup(name)
        return model.name if model else name or None

    def named_in(self, body: bytes) -> str | None:
        """The served model a JSON body names (vLLM's default when it names none)."""
        try:
            found = top_members(body, _Model)
        except Exception:
            found = None
        named = found.get("model") if found else None
        return self.model_name(named if isinstance(named, str) else None)

    async def refresh(self, session: aiohttp.ClientSession) -> None:
        """Read /version and /v1/models; (re)load models that are new or changed."""
        async with self._lock:
            base = self._settings.upstream_base
            version = await get_json(session, f"{base}/version")
            listing = await get_json(session, f"{base}/v1/models")
            served = await served_tasks(session, base)
            release = Release(str(version.get("version")) if isinstance(version, dict) else None)
            entries = with_contexts(listing.get("data", []) if isinstance(listing, dict) else [])
            models: dict[str, ServedModel] = {}
            for entry in parents_first(entries):
                parent = models.get(str(entry.get("parent")))
                if parent is not None and str(entry["id"]) not in self._settings.models:
                    models[str(entry["id"])] = self._adapter(entry, parent)
                else:
                    models[str(entry["id"])] = await self._resolve(entry, release, served)
            if release != self.release:
                warn_if_unproven(release)
            self.release, self.models, self._served = release, models, served
            self.last_success = time.monotonic()
            self.ready.set()

    def _adapter(self, entry: dict[str, Any], parent: ServedModel) -> ServedModel:
        """A LoRA adapter: its parent's knowledge under its own name and root. vLLM
        renders an adapter's requests with its engine's one tokenizer and template (the
        adapter is only the engine request's ``lora_request``: 0.29 and 0.32), within the
        engine's context, so its parent's tokenizer counts and audits them."""
        name = str(entry["id"])
        model = replace(parent, name=name, root=str(entry.get("root") or name))
        if self.models.get(name) != model:
            log.info("adapter_discovered", model=name, root=model.root, parent=parent.name)
        return model

    async def _resolve(
        self, entry: dict[str, Any], release: Release, served: ServedTasks | None
    ) -> ServedModel:
        name = str(entry["id"])
        known = self.models.get(name)
        if (
            known is not None
            and known.root == str(entry.get("root") or name)
            and known.max_model_len == entry.get("max_model_len")
            and known.profile is not None
            and known.profile.release == release
            and self._served == served
        ):
            return known
        override = self._settings.models.get(name)
        loop = asyncio.get_running_loop()
        pinned = self._settings.upstream_transformers
        legacy = release.runs_transformers_4 if pinned == "auto" else pinned == "4"
        model = await loop.run_in_executor(
            None, build_model, entry, release, override, self._loader, served, legacy
        )
        if isinstance(model.tokenizer, HFTokenizer):
            model.tokenizer.serve(self.cache, model.max_model_len)
            if self._pool is not None:
                await loop.run_in_executor(None, self._pool.warm, model.tokenizer)
        (log.warning if model.problem else log.info)(
            "model_discovered",
            model=name,
            root=model.root,
            family=model.profile.family.value if model.profile else None,
            prompt=_prompt_source(model),
            tokenizer_semantics=_semantics(model, release, self._settings.upstream_transformers),
            max_model_len=model.max_model_len,
            upstream_version=release.version,
            problem=model.problem,
        )
        return model

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Refresh forever: every few seconds until the first success, then periodically."""
        while True:
            try:
                await self.refresh(session)
                self.problem, self._refused = None, False
            except UpstreamError as exc:
                self.problem = discovery_problem(self._settings.upstream_base, exc)
                self._refused = isinstance(exc.__cause__, aiohttp.ClientResponseError)
                log.warning("discovery_failed", error=self.problem)
            except Exception:  # discovery must outlive any surprise; requests go unaudited
                log.exception("discovery_crashed")
            delay = self._settings.refresh_interval if self.last_success else _RETRY_SECONDS
            await asyncio.sleep(delay)


def parents_first(entries: list[Any]) -> list[dict[str, Any]]:
    """The ``/v1/models`` entries that name a model, base models before LoRA adapters
    (vLLM lists them so; an adapter is resolved from its parent)."""
    named = [e for e in entries if isinstance(e, dict) and e.get("id")]
    return sorted(named, key=lambda e: bool(e.get("parent")))


def with_contexts(entries: Any) -> list[Any]:
    """``/v1/models`` entries, a LoRA adapter's given its parent's ``max_model_len``: vLLM
    lists an adapter without one (``OpenAIServingModels.show_available_models``), and it
    runs in its base model's engine, within that context."""
    if not isinstance(entries, list):
        return []
    contexts = {
        e.get("id"): e.get("max_model_len")
        for e in entries
        if isinstance(e, dict) and e.get("max_model_len")
    }
    return [
        {**e, "max_model_len": contexts[e.get("parent")]}
        if isinstance(e, dict) and not e.get("max_model_len") and e.get("parent") in contexts
        else e
        for e in entries
    ]


CATALOG = web.AppKey("catalog", Catalog)


def catalog_context(catalog: Catalog) -> Callable[[web.Application], AsyncIterator[None]]:
    """cleanup_ctx: publish the catalog and own its refresh task (cancelled on shutdown)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        app[CATALOG] = catalog
        task = asyncio.create_task(catalog.run(app[SESSION]), name="catalog-refresh")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return ctx
