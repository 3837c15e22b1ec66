"""The Lua scripts the shared limiter runs in Redis/Valkey (``lua/*.lua``, package data
read once at import), each atomic on the store's clock (``TIME``): a reservation, its end
(settle, release or cancel), a replica's contribution of its journal to the store
(``SYNC``), the renewal of the holds of its reservations still alive (``RENEW``), and its
heartbeat in the registry (``BEAT``).

The keys and fields they work on are told in ``keyspace``. A request a replica admitted
without the store is held in ``reserved`` by its next contribution (``SYNC``) and given
back by its end. A contribution (a reservation's or ``SYNC``'s) only ever raises the
replica's own field to its own total, so writing it twice, or after a retry, or out of
order, counts nothing twice. A settlement adds its billed units to that field in the same
step that gives its reservation back, once per id; the total a replica contributes leaves
out its settlements on their way to the store, so no settlement is in ``used`` and in
``reserved`` at once (which refused requests the budget had room for), nor lost to a
concurrent one (a total that left it out, written after it). A settlement whose sending
failed is in the replica's total from then on, and is sent again as ``late``: its hold
given back, nothing added.

The store's generation says whether the budgets are whole. A store found empty (started
anew, or a fresh deployment) starts a generation: until every replica the operator
declared (``--limits-replicas``) has contributed its journal (``c:<replica>``), or every
replica alive in the registry has and either a grace of three heartbeats has passed or
they are as many as a replica counted before (``seen``), the generation is incomplete and
nothing is reserved on it: the replicas admit by their fail mode meanwhile (``local``: in
process, each by its share of what the store last told it was left), and contribute what
they admit so. A replica's first contribution to a generation new to it also takes again
the holds of the requests it has in flight through the store (once: a hold already there
is left).

Ids: the first end of a reservation id (its done key, set if absent) is the one that adds
units and gives rate capacity back; a hold is given back by removing its member, which
only one end can do. A contribution that carries settlements whose sending failed (in the
replica's total from then on) sets their done keys, so that one of them reaching the
store afterwards adds nothing (it would count twice); a reservation whose answer was lost
is cancelled by its id (its done key set: if the script reaches the store after that, it
reserves nothing), and its holds given back.
"""

from __future__ import annotations

from importlib.resources import files


def _read(name: str) -> str:
    """One script of ``lua/``, as the installed package holds it."""
    return (files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


# The functions a reservation and a contribution share, defined ahead of each:
# complete(gen, registry, now, grace), contribute(k, replica, own, expire_at) and
# claim(first, count, ttl).
FUNCTIONS = _read("complete") + _read("contribute") + _read("claim")
RESERVE = FUNCTIONS + _read("reserve")
END = _read("end")
SYNC = FUNCTIONS + _read("sync")
RENEW = _read("renew")
STAMP = _read("stamp")
BEAT = _read("beat")
