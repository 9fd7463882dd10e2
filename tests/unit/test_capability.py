"""`Capability`: a runtime-checkable Protocol's isinstance, remembered per object (contracts/capability.py)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from vllm_srun.adapters.contracts.capability import MAX_REMEMBERED, Capability


@runtime_checkable
class Sized(Protocol):
    width: int


class Model:
    def __init__(self, width: int | None) -> None:
        if width is not None:
            self.width = width


class Slotted:
    __slots__ = ("width",)  # no __weakref__: nothing to remember it by

    def __init__(self) -> None:
        self.width = 3


def test_it_answers_as_isinstance_and_remembers_the_answer_per_object() -> None:
    is_sized: Capability[Sized] = Capability(Sized)
    yes, no = Model(4), Model(None)
    assert is_sized(yes) and not is_sized(no)
    no.width = 5  # a loaded model does not change what it provides: the first answer stands
    assert not is_sized(no)
    assert is_sized(Model(5))  # another object is asked afresh


def test_an_object_gone_is_forgotten_even_when_another_takes_its_address() -> None:
    is_sized: Capability[Sized] = Capability(Sized)
    answers = []
    for n in range(200):  # freed objects' addresses are reused: each new one must be asked afresh
        obj = Model(n if n % 2 else None)
        answers.append(is_sized(obj))
        del obj  # freed here (reference counting)
    assert answers == [bool(n % 2) for n in range(200)]


def test_an_object_without_weak_references_is_asked_every_time() -> None:
    is_sized: Capability[Sized] = Capability(Sized)
    obj = Slotted()
    assert is_sized(obj)
    del obj.width
    assert not is_sized(obj)


def test_it_remembers_a_bounded_number_of_objects() -> None:
    is_sized: Capability[Sized] = Capability(Sized)
    kept = [Model(1) for _ in range(MAX_REMEMBERED * 3)]
    assert all(is_sized(obj) for obj in kept)
    assert len(is_sized) <= MAX_REMEMBERED
