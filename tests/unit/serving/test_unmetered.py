"""What --allow-unmetered relays: the paths and prefixes it names, its features apart."""

from __future__ import annotations

from proxy.metrics import Metrics
from proxy.serving.unmetered import Unmetered
from proxy.settings import Settings


def test_paths_prefixes_and_features_are_told_apart() -> None:
    """An exact path, a prefix ending in ``*`` and a feature name; nothing else."""
    settings = Settings(
        upstream="http://x", allow_unmetered="/sleep, /v1/audio/*,responses.background"
    )
    unmetered = Unmetered(settings.unmetered, Metrics(settings))
    assert unmetered.allows("/sleep")
    assert unmetered.allows("/v1/audio/transcriptions")
    assert not unmetered.allows("/sleep/more")
    assert not unmetered.allows("/v1/embeddings")
    assert unmetered.features == {"responses.background"}


def test_each_use_is_counted_by_what_it_names() -> None:
    """A named path is its own label; what a prefix admits is 'other' (bounded labels)."""
    settings = Settings(upstream="http://x", allow_unmetered="/sleep,/x/*")
    metrics = Metrics(settings)
    unmetered = Unmetered(settings.unmetered, metrics)
    unmetered.relayed("/sleep")
    unmetered.relayed("/x/anything")
    assert metrics.unmetered.labels("/sleep")._value.get() == 1
    assert metrics.unmetered.labels("other")._value.get() == 1
