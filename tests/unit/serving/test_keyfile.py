"""The --api-keys file reloaded in place: a valid file replaces the map whole, a bad one
leaves it (counted), an unchanged file is not read again."""

from __future__ import annotations

from pathlib import Path

from proxy.metrics import Metrics
from proxy.serving.keyfile import KeyFile
from proxy.serving.tenancy import Attribution, Refusal, TenantResolver, key_digest
from proxy.settings import Settings


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_new_map_replaces_the_old_one_whole(tmp_path: Path) -> None:
    """After a reload a removed key is refused and an added one attributed; the gauge
    says how many keys are in use."""
    path = tmp_path / "keys.yaml"
    path.write_text(f"acme: {key_digest('sk-a')}\n")
    resolver = TenantResolver(key_tenants={key_digest("sk-a"): "acme"})
    metrics = Metrics(Settings(upstream="http://x"))
    keys = KeyFile(path, resolver, metrics)
    path.write_text(f"beta: {key_digest('sk-b')}\nbeta2: {key_digest('sk-c')}\n")
    assert keys.reload("test")
    assert isinstance(resolver.resolve(bearer("sk-a")), Refusal)
    assert resolver.resolve(bearer("sk-b")) == Attribution("beta", key_digest("sk-b")[:12], True)
    assert metrics.keys_loaded._value.get() == 2


def test_a_bad_file_keeps_the_map_in_use(tmp_path: Path) -> None:
    """Unreadable, empty or malformed: logged, counted, and the old keys still work."""
    path = tmp_path / "keys.yaml"
    resolver = TenantResolver(key_tenants={key_digest("sk-a"): "acme"})
    metrics = Metrics(Settings(upstream="http://x"))
    keys = KeyFile(path, resolver, metrics)
    for text in ("acme: not-hex\n", "", "[unclosed\n"):
        path.write_text(text)
        assert not keys.reload("test")
    path.unlink()
    assert not keys.reload("test")
    assert metrics.keys_reload_failures._value.get() == 4
    assert isinstance(resolver.resolve(bearer("sk-a")), Attribution)
