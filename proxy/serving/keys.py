"""Typed application state for the objects ``create_app`` builds from the layers below
serving (they know nothing of aiohttp); serving's own resources own their keys."""

from __future__ import annotations

from aiohttp import web

from proxy.ledger.journal import Journal
from proxy.ledger.outbox import Outbox
from proxy.ledger.reconciler import Reconciler
from proxy.ledger.recorder import Recorder
from proxy.metrics import Metrics
from proxy.tokenizers.pool import TokenizerPool

METRICS = web.AppKey("metrics", Metrics)
RECORDER = web.AppKey("recorder", Recorder)
JOURNAL = web.AppKey("journal", Journal)
OUTBOX = web.AppKey("outbox", Outbox)
RECONCILER = web.AppKey("reconciler", Reconciler)
POOL = web.AppKey("tokenizer_pool", TokenizerPool)
