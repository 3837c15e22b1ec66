"""Wiring: build the aiohttp application from settings and its collaborators.

Every resource is built here, in order, and handed to what uses it as a parameter; the
``cleanup_ctx`` entries only open and close them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web

from proxy.accounting.prices import PriceTable
from proxy.accounting.routes import Handling
from proxy.ledger.exporters import build_sinks
from proxy.ledger.journal import Journal
from proxy.ledger.outbox import Outbox
from proxy.ledger.reconciler import Reconciler
from proxy.ledger.recorder import Recorder, Subscriber
from proxy.ledger.sinks import Sink
from proxy.limits.costs import unpriced
from proxy.limits.limiter import Limiter
from proxy.limits.policy import Policies
from proxy.limits.problems import read_limits
from proxy.limitstore.wiring import build_limiter
from proxy.metrics import Metrics
from proxy.serving import admin
from proxy.serving.admin_api import build_admin_api
from proxy.serving.adminrelay import admin_socket_context
from proxy.serving.admission import ADMISSION, Admission, add_headers
from proxy.serving.adoption import adoption_context
from proxy.serving.attribution import attribution, build_resolver
from proxy.serving.audited import AUDITOR, ScoringAuditor
from proxy.serving.bodies import BodyBudget
from proxy.serving.budget_restore import restore_context
from proxy.serving.catalog import Catalog, catalog_context
from proxy.serving.exchange import EXCHANGES, Exchanges, Work
from proxy.serving.isolation import CacheSalts, ResponseOwners
from proxy.serving.keyfile import KEYFILE, KeyFile, key_file_context
from proxy.serving.keys import METRICS, OUTBOX, RECONCILER, RECORDER
from proxy.serving.lifetimes import counters_reader, ledger_context, reconciler_context
from proxy.serving.limitsfile import LIMITSFILE, LimitsFile, limits_file_context
from proxy.serving.metered import METERED, MeteredRelay
from proxy.serving.pod import POD_STATE, Place, PodState
from proxy.serving.podlimits import hosted, hosted_context, replica_settings
from proxy.serving.pricesfile import (
    PRICESFILE,
    Prices,
    PricesFile,
    prices_file_context,
    read_table,
)
from proxy.serving.prompts import PromptCounter
from proxy.serving.readiness import READINESS
from proxy.serving.readycheck import readiness_check
from proxy.serving.realtime import RealtimeRelay
from proxy.serving.relayed import Relay
from proxy.serving.routing import Invocations, Router, guard
from proxy.serving.sendwatch import SendWatch, send_watch_context
from proxy.serving.shares import TenantShares
from proxy.serving.startup import file_problem, store_password
from proxy.serving.tenancy import TenantResolver
from proxy.serving.tracing import tell_trace
from proxy.serving.unmetered import Unmetered
from proxy.serving.upstream import SESSION, session_context
from proxy.serving.usage_answers import build_figures
from proxy.serving.usage_api import add_usage_routes
from proxy.settings import CacheSalting, Durability, Settings
from proxy.tokenizers.pool import TokenizerPool

POOL = web.AppKey("tokenizer_pool", TokenizerPool)


def pool_context(pool: TokenizerPool) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        yield
        pool.shutdown()

    return ctx


def build_ledger(
    settings: Settings, metrics: Metrics, sinks: list[Sink] | None
) -> tuple[Journal | None, Outbox | None]:
    """The journal and its outbox as the settings ask (none with --journal off)."""
    if not settings.metering:
        return None, None
    journal = Journal(
        Path(settings.journal),
        sync=settings.durability is Durability.SYNC,
        commit_timeout=settings.journal_commit_timeout,
        commit_interval=settings.commit_interval,
        on_replaced=lambda carried: metrics.journal_replaced.inc(),
        on_health=lambda ok: metrics.journal_ready.set(float(ok)),
    )
    exporters = build_sinks(settings) if sinks is None else sinks
    retention = settings.journal_retention * 3600
    return journal, Outbox(journal, exporters, metrics=metrics, retention=retention)


def build_reconciler(
    settings: Settings,
    app: web.Application,
    exchanges: Exchanges,
    journal: Journal | None,
    metrics: Metrics,
) -> Reconciler:
    url = settings.upstream_base + settings.reconcile_metrics_path
    return Reconciler(
        exchanges,
        counters_reader(lambda: app[SESSION], url),
        journal,
        metrics,
        interval=settings.reconcile_interval,
        instance=settings.instance,
        upstream=settings.upstream_base,
        shared=settings.reconcile_shared_upstream,
    )


CleanupContext = Callable[[web.Application], AsyncIterator[None]]


def build_token_usage(settings: Settings) -> tuple[Subscriber, CleanupContext] | None:
    """The OpenTelemetry GenAI token-usage metric, when an OTLP endpoint is configured."""
    if settings.otlp_metrics_endpoint is None:
        return None
    from proxy.serving.otlp import token_usage  # opentelemetry only with an endpoint

    return token_usage(settings)


def build_budget(settings: Settings) -> BodyBudget:
    return BodyBudget(
        settings.max_inflight_body_bytes, settings.max_body_bytes, settings.body_read_timeout
    )


def build_shares(settings: Settings, metrics: Metrics) -> TenantShares:
    connections, bodies = settings.upstream_connections, settings.max_inflight_body_bytes
    tenants = bool(settings.api_keys or settings.tenant_header)
    return TenantShares(connections, bodies, settings.tenant_share, metrics, enforced=tenants)


def build_prices(settings: Settings, metrics: Metrics) -> Prices | None:
    """The --prices file's table (None without one). A file that cannot be loaded at
    start stops the start, in one line: there is no table in use to keep."""
    if settings.prices is None:
        return None
    path = Path(settings.prices)
    try:
        table = read_table(path)
    except ValueError as exc:
        fix = "fix the path, or the file (docs/metering.md: Prices)"
        raise file_problem(exc, "--prices", path, fix) from None
    return Prices(table, metrics)


def build_admission(
    settings: Settings,
    catalog: Catalog,
    pool: TokenizerPool,
    metrics: Metrics,
    prices: Prices | None = None,
    pod: Place | None = None,
) -> Admission | None:
    """Admission against the --limits file's policies (None without one). A file that
    cannot be loaded at start, or whose money budgets apply to a model without a price,
    stops the start: there are no policies in use to keep. A pod's worker admits through
    the pod's limiter host, or as a replica of its own on the store (``podlimits``)."""
    if settings.limits is None:
        return None
    path = Path(settings.limits)
    try:
        policies = read_limits(path)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and LimitsFileError too
        fix = "fix the path, or the file (README: Budgets and rate limits)"
        raise file_problem(exc, "--limits", path, fix) from None
    table = prices.table if prices is not None else None
    problem = unpriced(policies, table, [], datetime.now(UTC))
    if problem is not None:
        fix = "price those models in --prices, or change the budget"
        raise file_problem(ValueError(problem), "--limits", path, fix)
    limiter = build_pod_limiter(settings, policies, metrics, pod)
    timeout = settings.accounting_timeout
    prompts = PromptCounter(settings.upstream_base, metrics, timeout=timeout)
    return Admission(
        limiter,
        catalog,
        pool,
        metrics,
        count_timeout=timeout,
        prices=prices,
        horizon=settings.read_timeout,
        prompts=prompts,
    )


def build_pod_limiter(
    settings: Settings, policies: Policies, metrics: Metrics, pod: Place | None
) -> Limiter:
    """The limiter of ``policies``: in this process, on the store (a pod's worker: a
    replica of its own), or, for a pod's worker without a store, on the pod's limiter
    host (connected in its lifetime, before the worker serves)."""
    if settings.limits_store is None:
        host = pod.limiter_socket if pod is not None else None
        return build_limiter(settings, policies, metrics, host=host, part=pod.index if pod else 0)
    password = store_password(settings)
    replica = settings if pod is None else replica_settings(settings, pod)
    return build_limiter(replica, policies, metrics, password=password)


A, M, D = Handling.AUDITED, Handling.METERED, Handling.DISPATCHED


def add_limits(
    app: web.Application,
    settings: Settings,
    admission: Admission,
    journal: Journal | None,
    metrics: Metrics,
    resolver: TenantResolver,
    catalog: Catalog,
    pod: Place | None = None,
) -> None:
    """Headers on every answer, the file's live reload, budgets rebuilt at start."""
    assert settings.limits is not None
    app[ADMISSION] = admission
    tenants = (lambda: resolver.key_tenants) if settings.api_keys else (lambda: None)
    app[LIMITSFILE] = LimitsFile(
        Path(settings.limits),
        admission.limiter,
        metrics,
        check=money_check(admission),
        tenants=tenants,
        catalog=catalog,
    )
    app.on_response_prepare.append(add_headers)
    app.cleanup_ctx.append(limits_file_context(app[LIMITSFILE]))
    lifetime = admission.limiter.lifetime(journaled=journal is not None)
    app.cleanup_ctx.append(hosted_context(lifetime) if hosted(settings, pod) else lifetime)


def money_check(admission: Admission) -> Callable[[Policies], str | None]:
    """Whether policies can be used with the prices in use (a limits file's reload)."""

    def check(policies: Policies) -> str | None:
        served = admission.catalog.models
        return unpriced(policies, admission.table, served, datetime.now(UTC))

    return check


def add_prices(
    app: web.Application,
    settings: Settings,
    prices: Prices,
    admission: Admission | None,
    metrics: Metrics,
) -> None:
    """The price file's live reload, checked against the limits in use."""
    assert settings.prices is not None

    def check(table: PriceTable) -> str | None:
        if admission is None:
            return None
        policies, served = admission.limiter.policies, admission.catalog.models
        return unpriced(policies, table, served, datetime.now(UTC))

    app[PRICESFILE] = PricesFile(Path(settings.prices), prices, metrics, check=check)
    app.cleanup_ctx.append(prices_file_context(app[PRICESFILE]))


def known(resolver: TenantResolver, admission: Admission | None) -> list[str]:
    """The tenants the key file and the limits file name."""
    limited = admission.limiter.policies.tenants if admission is not None else {}
    return [*resolver.key_tenants, *limited]


def create_app(
    settings: Settings,
    *,
    catalog: Catalog | None = None,
    pool: TokenizerPool | None = None,
    sinks: list[Sink] | None = None,
    pod: Place | None = None,
    adopted: Sequence[Path] = (),
) -> web.Application:
    """The proxy application; tests pass their own catalog (e.g. a tokenizer loader). A
    pod's worker passes its place in the pod (``serve --workers N``): its metrics go to
    the pod's multiprocess directory, its ``/readyz`` adds the pod's state
    (``POD_STATE``, which its control channel keeps), the supervisor, not the worker,
    serves ``--admin-port``; it delivers the ``adopted`` shards a larger pod left, and
    its limits go to the pod's limiter host (or, with a store, it is a replica of its
    own)."""
    metrics_dir = pod.metrics_dir if pod is not None else None
    resolver = build_resolver(settings)
    pool = pool or TokenizerPool(settings.tokenizer_threads)
    catalog = catalog or Catalog(settings, pool=pool)
    metrics = Metrics(
        settings,
        trusted_tenants=resolver.key_tenants,
        served=catalog.serves,
        multiprocess_dir=metrics_dir,
    )
    journal, outbox = build_ledger(settings, metrics, sinks)
    shares = build_shares(settings, metrics)
    prices = build_prices(settings, metrics)
    admission = build_admission(settings, catalog, pool, metrics, prices, pod)
    settle = {"settle": admission.settle} if admission else {}
    exchanges = Exchanges(build_budget(settings), shares, metrics, **settle)
    sends = SendWatch(settings.send_timeout, metrics)
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[guard(sends), attribution(resolver, metrics)],
    )
    reconciler = build_reconciler(settings, app, exchanges, journal, metrics)
    usage = build_token_usage(settings)
    spend = [prices.account] if prices is not None else []
    subscribers = [reconciler.account, *spend, *([usage[0]] if usage else [])]
    recorder = Recorder(journal, metrics, subscribers=subscribers)
    auditor = ScoringAuditor(settings, catalog, pool, recorder, metrics, admission)
    unmetered = Unmetered(settings.unmetered, metrics)
    owners = ResponseOwners(journal)
    salts = (
        None if settings.cache_salt is CacheSalting.OFF else CacheSalts(settings.cache_salt_secret)
    )
    metered = MeteredRelay(
        settings, catalog, recorder, metrics, unmetered, owners, salts, admission
    )
    invocations = Invocations(auditor, metered, catalog)
    handlers: dict[Handling, Work] = {A: auditor, M: metered, D: invocations}
    app[METRICS], app[POOL], app[RECORDER], app[RECONCILER] = metrics, pool, recorder, reconciler
    app[EXCHANGES], app[METERED], app[AUDITOR] = exchanges, metered, auditor
    if outbox is not None:
        app[OUTBOX] = outbox
    if admission is not None:
        add_limits(app, settings, admission, journal, metrics, resolver, catalog, pod)
    if prices is not None:
        add_prices(app, settings, prices, admission, metrics)
    if settings.api_keys:
        app[KEYFILE] = KeyFile(Path(settings.api_keys), resolver, metrics)
        app.cleanup_ctx.append(key_file_context(app[KEYFILE]))
    store = admission.limiter.problem if admission else None
    priced = app[PRICESFILE].unpriced if prices is not None else None
    figures = build_figures(settings, admission, prices, pod.index if pod is not None else 0)
    admin_api = build_admin_api(app, settings, figures, lambda: known(resolver, admission))

    check = readiness_check(catalog, journal, store, priced)
    app[READINESS] = check

    def admin_routes(port: web.Application) -> None:
        admin.add_routes(port, check, metrics)
        admin_api(port)

    restore = []  # a hosted limiter's host restored every shard before any worker started
    if admission is not None and not hosted(settings, pod):
        restore.append(restore_context(admission, journal, metrics, adopted))
    for context in (
        # first in, last out: the metric is flushed after every exchange has its record
        *([usage[1]] if usage else []),
        session_context(settings),
        catalog_context(catalog),
        pool_context(pool),
        ledger_context(settings, journal, outbox, exchanges),
        *([adoption_context(settings, adopted, sinks, metrics)] if adopted else []),
        *restore,
        # a pod's worker tallies; the supervisor reconciles (serving.podreconcile)
        *([reconciler_context(settings, reconciler)] if pod is None else []),
        send_watch_context(sends),
    ):
        app.cleanup_ctx.append(context)
    if pod is None:
        app.cleanup_ctx.append(admin.admin_context(settings, admin_routes))
    else:  # the pod's supervisor serves --admin-port
        app[POD_STATE] = PodState()
        app.cleanup_ctx.append(admin.task_sampler_context(metrics))
        if pod.index == 0 and settings.admin_tokens is not None:
            app.cleanup_ctx.append(admin_socket_context(pod, admin_api))
    page = metrics if settings.admin_port is None else None
    admin.add_routes(app, check, page, app.get(POD_STATE))
    add_usage_routes(app, figures)
    relay = Relay(settings.upstream_base, settings.body_read_timeout, metrics)
    admin_port = settings.admin_port is not None
    sessions = RealtimeRelay(settings, metrics, metered.settle, catalog.serves, admission)
    routes = Router(
        exchanges,
        handlers,
        relay,
        unmetered,
        shares,
        owners,
        admin_port=admin_port,
        sessions=sessions,
    )
    app.router.add_route("*", "/{tail:.*}", routes.handle)
    app.on_response_prepare.append(tell_trace)
    return app
