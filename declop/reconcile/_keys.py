"""Keys: what a controller remembers of each key between its runs, each table with one owner.

- :class:`PrimaryCache`: the caches of the primary informers, where a key's object is read;
- :class:`KeyNotes`: why a key runs next (its trace), the delayed add it waits for, and the
  resourceVersion last reported as failing the typed handler's model;
- :class:`FinalizerWrites`: our own finalizer writes — their echoes, the objects we released,
  and the ``CREATED`` calls given back after we added our finalizer;
- :class:`ShardBook`: in sharded mode, what finds a key's range (the uid of its object) and the
  deletions dropped at the fence (tombstones).

Each owner's tables are written only through its methods, with two exceptions on the hot path
(one event, no extra call): the controller's subscriber notes a primary event's uid and trace
counts inline. Callers may test a table for emptiness before calling a method (``if
echoes.added: echoes.ran(key)``). Everything runs on the event loop.
"""

from __future__ import annotations

from typing import Any, Iterable

from declop.kube.keys import Request
from declop.queue.workqueue import WorkQueue
from declop.reconcile._filters import ident, only_our_finalizer
from declop.reconcile.trigger import Trace

__all__ = ["FinalizerWrites", "KeyNotes", "PrimaryCache", "ShardBook"]

Ident = tuple[str | None, str]


class PrimaryCache:
    """The stores of the informers whose events wake a controller (its primary informers)."""

    __slots__ = ("informers", "stores")

    def __init__(self, informers: Iterable[Any]) -> None:
        self.informers: tuple[Any, ...] = tuple(informers)
        #: their stores, in the same order (what a handler's client reads first)
        self.stores: tuple[Any, ...] = tuple(i.store for i in self.informers)

    def get(self, key: Request) -> Any:
        """The cached object of ``key`` (None: not cached). A reconcile reads only the cache."""
        for informer in self.informers:
            if not informer.namespace or informer.namespace == key.namespace:
                obj = informer.store.get(key)
                if obj is not None:
                    return obj
        return None

    def __contains__(self, informer: object) -> bool:
        return informer in self.informers


class KeyNotes:
    """Per key, what its next run needs to know.

    Invariants:
    - ``traces[key]`` collects every cause since the key's previous run; a worker takes it with the
      key (:meth:`take`), and a key given back gets it back ahead of newer causes (:meth:`restore`);
    - ``delayed[key]`` is the cause of the key's pending delayed add (a retry with its error's type,
      or a requeue_after); it is noted in the run that serves it — the one taken when no add of the
      key is waiting any more — not in a run an event brought forward;
    - a key dropped at the fence loses both (:meth:`drop`): its owner reconciles it;
    - ``invalid[key]`` is the resourceVersion last reported as failing the typed model: each
      resourceVersion is reported once (:meth:`first_report`), and the note goes once the key
      validates or is gone (:meth:`valid`);
    - ``seen`` (kept only for a handler that declares ``first_seen``) holds the keys whose call
      succeeded on an existing object in this process; a key leaves it when a call finds its
      object gone (a re-created object is first seen again), and when it is dropped at the fence
      or its range went to another replica (``Controller.forget``).
    """

    __slots__ = ("traces", "delayed", "invalid", "seen")

    def __init__(self) -> None:
        self.traces: dict[Request, Trace] = {}
        self.delayed: dict[Request, tuple[str, str | None]] = {}
        self.invalid: dict[Request, str] = {}
        self.seen: set[Request] = set()

    def trace(self, key: Request) -> Trace:
        """The trace of ``key``'s next run (created on first use)."""
        trace = self.traces.get(key)
        if trace is None:
            trace = self.traces[key] = Trace()
        return trace

    def take(self, key: Request, queue: WorkQueue[Request]) -> Trace:
        """The trace of the run of ``key`` that starts now, with its delayed add's cause if due."""
        trace = self.traces.pop(key, None)
        if trace is None:
            trace = Trace()
        delayed = self.delayed
        if delayed and key in delayed and not queue.is_waiting(key):
            why, detail = delayed.pop(key)  # its delayed add is due: this run serves it
            trace.note(why, None, detail)
        return trace

    def restore(self, key: Request, trace: Trace) -> None:
        """A given-back key keeps the causes it was taken with, ahead of any newer ones."""
        newer = self.traces.get(key)
        if newer is not None:
            trace.merge(newer)
        self.traces[key] = trace

    def delay(self, key: Request, why: str, detail: str | None) -> None:
        """A delayed add of ``key`` was made because of ``why`` (``detail``: the error's type)."""
        self.delayed[key] = (why, detail)

    def pending(self, key: Request) -> tuple[str, str | None] | None:
        """The cause of ``key``'s delayed add still to be served, if any."""
        return self.delayed.get(key)

    def drop(self, key: Request) -> None:
        self.traces.pop(key, None)
        self.delayed.pop(key, None)
        self.seen.discard(key)

    def first_report(self, key: Request, resource_version: str) -> bool:
        """``key`` fails its model at ``resource_version``: True unless that was reported already."""
        seen = self.invalid.get(key)
        self.invalid[key] = resource_version
        return seen != resource_version

    def valid(self, key: Request) -> None:
        """``key`` validated (or is gone): a later failure is reported again."""
        if self.invalid:
            self.invalid.pop(key, None)


class FinalizerWrites:
    """Our own finalizer writes and what they imply for events and later runs.

    Tables, by ``(namespace, name)``: ``own_writes`` — the resourceVersion our last finalizer
    patch of the object produced, while its event is still to come; ``writing`` — the
    resourceVersions of finalizer-only events seen while a patch of ours is in flight (whose they
    are is known once it answers); ``released`` — the uid of an object being deleted whose
    finalizer we released. By key: ``added`` — keys whose ``CREATED`` call was given back after
    we added our finalizer, or whose ``CREATED`` call failed; ``left`` — with ``labels=`` or
    ``fields=``, the uid of an object that left the filter still carrying our finalizer.

    Invariants:
    - an event is dropped as our echo only when its resourceVersion is one our patch produced and
      it differs from the previous state by our finalizer alone; one arriving while the patch is
      in flight is held until the answer tells whose it was (:meth:`begin`, :meth:`end`);
    - ``own_writes`` and ``released`` entries go with the object's deletion event (:meth:`gone`);
      an entry is written only for an object still cached, so none outlives its object;
    - a cached copy of an object being deleted, with our finalizer, after we released it from
      that very object (same uid) is stale (:meth:`stale`): the apiserver never adds a finalizer
      to an object being deleted;
    - a key in ``added`` is ``CREATED`` when it next runs unless it is being deleted or gone; it
      leaves once its handler was called and did not fail (:meth:`ran`): a ``CREATED`` call that
      raised goes back in (:meth:`given_back`), so the create is retried as ``CREATED`` until one
      succeeds — on this replica: a restart or a new owner reads the finalizer and says ``UPDATED``;
    - a key in ``left`` runs as ``DELETED`` (the filtered cache no longer holds it); once such a
      call succeeded our finalizer is released from the object as the apiserver has it now, if
      that object (same uid) is still outside the filter (:func:`~declop.reconcile._outcome.finish`).
      The entry goes with that release, with the object gone or renamed by a new uid, or with a
      call that found the object back in the filter.
    """

    __slots__ = ("own_writes", "writing", "released", "added", "left")

    def __init__(self) -> None:
        self.own_writes: dict[Ident, str] = {}
        self.writing: dict[Ident, list[str]] = {}
        self.released: dict[Ident, str] = {}
        self.added: set[Request] = set()
        self.left: dict[Request, str] = {}

    def gone(self, obj: Any) -> None:
        """The deletion event of ``obj``: nothing of it is remembered any more."""
        if self.own_writes or self.released:
            self.own_writes.pop(ident(obj), None)
            self.released.pop(ident(obj), None)

    def is_echo(self, old: Any, new: Any, finalizer: str) -> bool:
        """``new`` is the object one of our finalizer patches produced and nothing else changed —
        or it may be (a patch of that object is in flight and only our finalizer changed): then
        its resourceVersion is held for :meth:`end` to decide, and True is returned."""
        key_of = ident(new)
        rv: str | None = (new.get("metadata") or {}).get("resourceVersion")
        writing = self.writing
        held = writing.get(key_of) if writing else None
        if held is not None:
            if not only_our_finalizer(old, new, finalizer):
                return False
            held.append(rv or "")
            return True
        own_writes = self.own_writes
        if own_writes.get(key_of) != rv or rv is None:
            return False
        del own_writes[key_of]
        return only_our_finalizer(old, new, finalizer)

    def begin(self, obj: Any) -> None:
        """A finalizer patch of ours of ``obj`` is sent: look-alike events are held from now."""
        self.writing[ident(obj)] = []

    def end(self, obj: Any, written: Any, cached: bool) -> str | None:
        """The patch of ``obj`` answered ``written`` (None: it failed); ``cached``: the object is
        still in the cache. Returns the resourceVersion of a held event that was not ours (the key
        must be reconciled), if any."""
        key_of = ident(obj)
        held = self.writing.pop(key_of, [])
        meta = written.get("metadata") if isinstance(written, dict) and written is not obj else None
        rv = meta.get("resourceVersion") if meta else None
        if rv and rv not in held and cached:
            self.own_writes[key_of] = rv  # its event is still to come
        return next((r for r in held if r != rv), None)

    def release(self, obj: Any, uid: str) -> None:
        """We released our finalizer from ``obj`` (uid ``uid``, still cached)."""
        self.released[ident(obj)] = uid

    def stale(self, obj: Any, finalizer: str | None) -> bool:
        """``obj`` (being deleted) still shows our finalizer although we released it from this very
        object: the cache has not caught up with our own write."""
        if not self.released:
            return False
        meta = obj.get("metadata") or {}
        uid = self.released.get(ident(obj))
        return uid is not None and uid == meta.get("uid") and finalizer in (meta.get("finalizers") or ())

    def given_back(self, key: Request) -> None:
        """The ``CREATED`` call of ``key`` went back to the queue after we added our finalizer."""
        self.added.add(key)

    def created(self, key: Request, still: bool) -> bool:
        """Was ``key``'s ``CREATED`` call given back after we added our finalizer? ``still``: the
        object is neither being deleted nor gone (otherwise the note goes)."""
        added = self.added
        if not added or key not in added:
            return False
        if not still:
            added.discard(key)
        return still

    def ran(self, key: Request) -> None:
        """The handler was called for ``key``."""
        if self.added:
            self.added.discard(key)


class ShardBook:
    """In sharded mode, what finds a key's range once its object is gone, and the deletions a
    replica owes a range it takes back.

    Invariants:
    - sharded by uid, ``uids[key]`` is the uid of the key's object from its last event (so a
      deleted object's key still finds its range); it goes when a call that found no object
      succeeded and no newer cause of the key waits (:meth:`gone`: a retry, or a wake that came
      while the call ran, still needs it to find its range) or the key left the caches with its
      range (:meth:`forget`). Sharded by
      namespace, ``uids`` is None;
    - ``tombstones[r]`` holds keys dropped at the fence whose object was no longer cached (a
      deletion this replica could not deliver); they are queued when ``r`` is gained again
      (:meth:`tombstones_of`) — a range lost and retaken does not lose the deletions it missed;
    - ``unowned`` counts the keys dropped because their range was not ours.
    """

    __slots__ = ("uids", "tombstones", "unowned")

    def __init__(self, by_uid: bool) -> None:
        self.uids: dict[Request, str] | None = {} if by_uid else None
        self.tombstones: dict[int, set[Request]] = {}
        self.unowned = 0

    def uid_of(self, key: Request, obj: Any) -> str | None:
        """The uid that places ``key`` (its cached object ``obj``, or its last event's)."""
        uid = (obj.get("metadata") or {}).get("uid") if obj is not None else None
        if not uid and self.uids is not None:
            uid = self.uids.get(key)
        return uid or None

    def refused(self, key: Request, index: int | None, cached: bool) -> None:
        """``key`` (range ``index``; None: unknown) was dropped at the fence."""
        self.unowned += 1
        if index is not None and not cached:
            self.tombstones.setdefault(index, set()).add(key)  # a deletion: owed if ours again

    def skipped(self) -> None:
        """A prepared call was not started: its range stopped being ours meanwhile."""
        self.unowned += 1

    def tombstones_of(self, index: int) -> list[Request]:
        """The deletions of range ``index`` dropped meanwhile, now owed (each once)."""
        return sorted(self.tombstones.pop(index, ()))

    def gone(self, key: Request) -> None:
        """A call of ``key`` found no object and succeeded: its next event (a new object) brings
        a new uid."""
        if self.uids is not None:
            self.uids.pop(key, None)

    def forget(self, keys: Iterable[Request], cached: PrimaryCache) -> int:
        """``keys`` left a primary store with their range: forget the uids of those no primary
        store still caches. Returns how many were forgotten."""
        uids = self.uids
        if uids is None:
            return 0
        n = 0
        for key in keys:
            if cached.get(key) is None and uids.pop(key, None) is not None:
                n += 1
        return n
