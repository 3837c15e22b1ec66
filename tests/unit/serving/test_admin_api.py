"""The admin API's token file and page cursors: tokens held as digests, reloaded whole
or not at all (also when the file changes), compared to the bearer token; a cursor read
back as the place it names, and anything else refused as a bad request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from proxy.ledger.lookup import marks_text, read_marks
from proxy.serving.admin_api import AdminTokens, cursor, read_cursor
from proxy.serving.tenancy import key_digest
from proxy.serving.usage_answers import BadRange


def asked(token: str | None) -> web.Request:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return make_mocked_request("GET", "/usage-proxy/admin/v1/standings", headers=headers)


def test_only_a_listed_token_is_allowed(tmp_path: Path) -> None:
    """The bearer token's digest must be listed; no token, another one, or the digest
    itself sent as the token, is not."""
    path = tmp_path / "admin.yaml"
    path.write_text(f"ops: [{key_digest('t1')}, {key_digest('t2')}]\n")
    tokens = AdminTokens(path)
    assert tokens.allows(asked("t1"))
    assert tokens.allows(asked("t2"))
    assert not tokens.allows(asked(None))
    assert not tokens.allows(asked("t3"))
    assert not tokens.allows(asked(key_digest("t1")))


def test_a_reload_replaces_the_tokens_whole_or_keeps_them(tmp_path: Path) -> None:
    """A valid file replaces the tokens; an empty, malformed or plaintext one is refused
    and the tokens in use stay."""
    path = tmp_path / "admin.yaml"
    path.write_text(f"ops: {key_digest('old')}\n")
    tokens = AdminTokens(path)
    for text in ("", "[unclosed\n", "ops: old\n"):
        path.write_text(text)
        assert not tokens.reload("test")
        assert tokens.allows(asked("old"))
    path.write_text(f"ops: {key_digest('new')}\n")
    assert tokens.reload("test")
    assert tokens.allows(asked("new"))
    assert not tokens.allows(asked("old"))


def test_a_file_without_tokens_is_refused_at_start(tmp_path: Path) -> None:
    """No digest listed: nothing could ever be allowed, so the start stops."""
    path = tmp_path / "admin.yaml"
    path.write_text("")
    with pytest.raises(ValueError, match="lists no admin token"):
        AdminTokens(path)


async def test_a_changed_file_is_reloaded_by_its_watch(tmp_path: Path) -> None:
    """The watch sees the file change and loads it."""
    path = tmp_path / "admin.yaml"
    path.write_text(f"ops: {key_digest('old')}\n")
    tokens = AdminTokens(path, poll=0.01)
    watch = asyncio.create_task(tokens.watch())
    path.write_text(f"ops: {key_digest('new')}\nmore: {key_digest('x')}\n")
    for _ in range(200):
        await asyncio.sleep(0.01)
        if tokens.allows(asked("new")):
            break
    watch.cancel()
    assert tokens.allows(asked("new"))


def test_a_cursor_names_its_place() -> None:
    """A cursor reads back as the (time, record id) it was made of."""
    place = ("2026-12-06T10:00:00.123456+00:00", "01a24ce5-65f8-772d-a207-fda137e6ca86")
    assert read_cursor(cursor(place)) == place


@pytest.mark.parametrize("marks", [{0: 12}, {0: 3, 1: 40, 12: 7}, {2: 1}])
def test_a_journal_cursor_names_each_shards_place(marks: dict[int, int]) -> None:
    """A pod's journal cursor reads back as each shard's last seq read; a cursor of one
    journal (a bare seq) is its shard 0's."""
    assert read_marks(read_cursor(cursor(("", marks_text(marks))))[1]) == marks
    assert read_marks(read_cursor(cursor(("", "12")))[1]) == {0: 12}


@pytest.mark.parametrize("text", ["", "%%%", "bm90IGEgY3Vyc29y", "//79"])
def test_anything_else_is_not_a_cursor(text: str) -> None:
    """Text that is not a cursor this API gave is a bad request."""
    with pytest.raises(BadRange):
        read_cursor(text)


@pytest.mark.parametrize(
    "place",
    [("", "12x"), ("", ""), ("yesterday", "0190a0a0"), ("", "0:1,0:2"), ("", "1:"), ("", "a:1")],
)
def test_a_cursor_naming_no_place_is_refused(place: tuple[str, str]) -> None:
    """A journal's place is a whole seq, a ledger's starts with a time: anything else is
    a bad request (400), never a read that fails in the reading process (503)."""
    with pytest.raises(BadRange):
        read_cursor(cursor(place))
