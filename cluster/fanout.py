"""One per-host fan-out: run a function for every host (or task) in threads, get a per-host result.

Fabric's ``ThreadingGroup``/``GroupResult`` is the model: every multi-host operation of the
orchestrator (preflight, code sync, firewall, start, stop, status) calls :func:`fan_out` and
reads a frozen :class:`FanOutResult`: outcomes in input order, ``ok`` and ``failed`` by key, and
one root-cause error that leads with the first failure in input order (not the first to finish,
so the same failures always read the same).

Only the expected errors (``catch``: pscluster's own, or a narrower type) become failures in the
result. Anything else (a bug, ``KeyboardInterrupt``, ``Terminated``) is re-raised once every
call has ended, the first in input order, as ``executor.map`` would.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Generic, Iterable, Iterator, TypeVar, cast

from .errors import Failure, MultiHostError, PsclusterError

I = TypeVar("I")    # noqa: E741 - the item: a HostSpec, TaskSpec or host name
T = TypeVar("T")    # what the function returns for one item

MAX_WORKERS = 32    # threads per fan-out; preflight passes its own MAX_PARALLEL


@dataclass(frozen=True)
class Outcome(Generic[I, T]):
    """What one call gave: its value, or the expected error it raised."""

    key: str
    item: I
    value: T | None = None
    error: PsclusterError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def result(self) -> T:
        """The value of a call that succeeded; raises the error of one that failed."""
        if self.error is not None:
            raise self.error
        return cast(T, self.value)


@dataclass(frozen=True)
class FanOutResult(Generic[I, T]):
    """The outcome of every call of one fan-out, in input order."""

    name: str
    outcomes: tuple[Outcome[I, T], ...]

    def __iter__(self) -> Iterator[Outcome[I, T]]:
        return iter(self.outcomes)

    def __len__(self) -> int:
        return len(self.outcomes)

    def __getitem__(self, key: str) -> Outcome[I, T]:
        for outcome in self.outcomes:
            if outcome.key == key:
                return outcome
        raise KeyError(key)

    @property
    def ok(self) -> dict[str, T]:
        """The value of each call that succeeded, by key, in input order."""
        return {o.key: cast(T, o.value) for o in self.outcomes if o.error is None}

    @property
    def succeeded(self) -> list[tuple[I, T]]:
        """Each item whose call succeeded, with its value, in input order."""
        return [(o.item, cast(T, o.value)) for o in self.outcomes if o.error is None]

    @property
    def failed(self) -> dict[str, PsclusterError]:
        """The error of each call that failed, by key, in input order."""
        return {o.key: o.error for o in self.outcomes if o.error is not None}

    @property
    def failures(self) -> list[Failure]:
        """The failures in input order, as :class:`MultiHostError` takes them."""
        return [Failure(o.key, o.error) for o in self.outcomes if o.error is not None]

    def root_cause(self) -> Failure | None:
        """The first failure in input order, or None when every call succeeded."""
        return next((Failure(o.key, o.error) for o in self.outcomes if o.error is not None), None)

    def raise_for_failures(self, summary: str | None = None, *, hint: str | None = None) -> None:
        """Raise one :class:`MultiHostError` for all failures, led by the root cause.

        Args:
            summary: its first line; by default ``"<name> failed on N host(s)"``.
            hint: its hint; by default the root cause's.
        """
        failures = self.failures
        if failures:
            raise MultiHostError(summary or f"{self.name} failed on {len(failures)} host(s)", failures, hint=hint)


def _key_of(item: object) -> str:
    if isinstance(item, str):
        return item
    name = getattr(item, "name", None)
    if isinstance(name, str):
        return name
    raise TypeError(f"fan_out: cannot key {item!r}: pass key=")


def fan_out(items: Iterable[I], fn: Callable[[I], T], *, name: str,
            key: Callable[[I], str] = _key_of,
            catch: type[PsclusterError] | tuple[type[PsclusterError], ...] = PsclusterError,
            max_workers: int = MAX_WORKERS, tick: Callable[[], None] | None = None,
            tick_every: float = 1.0) -> FanOutResult[I, T]:
    """Call ``fn(item)`` for every item in threads (at most ``max_workers`` at once) and wait
    for all of them.

    Args:
        items: hosts, tasks or host names; each key (``key(item)``, by default the item
            itself if a string, else its ``.name``) must be unique.
        fn: the work for one item; runs in a worker thread.
        name: what the fan-out does, for thread names and the default error summary.
        catch: the errors that make a failed outcome; ``()`` for none.
        max_workers: the most threads; fewer when there are fewer items, none for no item.
        tick: called in the caller's thread every ``tick_every`` seconds while calls are under
            way (a supervisor's heartbeat through a long launch); what it raises ends the wait
            once the calls under way ended, as a Ctrl-C does.

    Returns:
        every outcome, in the order of ``items``.

    Raises:
        BaseException: the first (in input order) error ``fn`` raised that ``catch`` does
            not cover, once every call has ended.
        ValueError: two items with one key, or ``max_workers`` below 1.
    """
    if max_workers < 1:
        raise ValueError(f"fan_out {name!r}: max_workers must be at least 1, got {max_workers}")
    items = list(items)
    keys = [key(item) for item in items]
    if len(set(keys)) != len(keys):
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"fan_out {name!r}: duplicate keys {duplicates}")
    if not items:
        return FanOutResult(name, ())
    with ThreadPoolExecutor(max_workers=min(max_workers, len(items)),
                            thread_name_prefix=f"fanout-{name.replace(' ', '-')}") as executor:
        futures = [executor.submit(fn, item) for item in items]
        # Waiting here, not in the `with`'s exit: a Ctrl-C while waiting still lets the calls
        # under way end (the exit joins them) before it propagates, so no host is left half-done.
        if tick is None:
            wait(futures)
        else:
            while wait(futures, timeout=tick_every).not_done:
                tick()
    # Read the outcomes in input order, not in the order the calls ended.
    outcomes: list[Outcome[I, T]] = []
    for item_key, item, future in zip(keys, items, futures):
        error = future.exception()
        if error is None:
            outcomes.append(Outcome(item_key, item, value=future.result()))
        elif isinstance(error, catch):
            outcomes.append(Outcome(item_key, item, error=error))
        else:
            raise error
    return FanOutResult(name, tuple(outcomes))
