"""A runtime-checkable Protocol's `isinstance`, remembered per object: what a surface asks of a
model on every request.

On Python 3.11 `isinstance(model, SomeProtocol)` walks the protocol's members each time, and a
request asks several of them: a visible share of the event loop's time under a load of short texts
(the profile's figures: docs/performance.md). A loaded model does not change what it provides, so
the answer is kept per object, held by a weak reference (a model unloaded and another made at the
same address is asked afresh). An object that takes no weak reference is asked every time.

    is_text_embedder: Capability[TextEmbedder] = Capability(TextEmbedder)
    if is_text_embedder(model):  # narrows like isinstance
        model.tokenize(...)
"""

from __future__ import annotations

import weakref
from typing import Generic, TypeGuard, TypeVar

T = TypeVar("T")

MAX_REMEMBERED = 256  # objects per protocol; past it the memory starts afresh


class Capability(Generic[T]):
    """`isinstance(obj, PROTOCOL)`, remembered per object (module doc)."""

    __slots__ = ("_seen", "protocol")

    def __init__(self, protocol: type) -> None:
        self.protocol = protocol
        self._seen: dict[int, tuple[weakref.ref[object], bool]] = {}

    def __len__(self) -> int:
        """Objects remembered now (at most `MAX_REMEMBERED`)."""
        return len(self._seen)

    def __call__(self, obj: object) -> TypeGuard[T]:
        hit = self._seen.get(id(obj))
        if hit is not None and hit[0]() is obj:
            return hit[1]
        answer = isinstance(obj, self.protocol)
        try:
            ref = weakref.ref(obj)
        except TypeError:  # no weak reference: asked every time
            return answer
        if len(self._seen) >= MAX_REMEMBERED:
            self._seen.clear()
        self._seen[id(obj)] = (ref, answer)
        return answer
