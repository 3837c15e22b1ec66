"""Typed application state for the objects ``create_app`` builds from the layers below
serving (they know nothing of aiohttp); serving's own resources own their keys. (The
tokenizer pool's is ``app.POOL``: this module stays light for the supervisor's control
channel, which must not import the tokenizers.)"""

from __future__ import annotations

from aiohttp import web

from proxy.ledger.journal import Journal
from proxy.ledger.outbox import Outbox
from proxy.ledger.reconciler import Reconciler
from proxy.ledger.recorder import Recorder
from proxy.metrics import Metrics

METRICS = web.AppKey("metrics", Metrics)
RECORDER = web.AppKey("recorder", Recorder)
JOURNAL = web.AppKey("journal", Journal)
OUTBOX = web.AppKey("outbox", Outbox)
RECONCILER = web.AppKey("reconciler", Reconciler)
