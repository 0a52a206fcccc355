"""Named layouts of the float64 state arrays (`st`) the numba code reads and writes.

A model hands numba its scalars, hyper-parameters and calibration state as one float64 array at
fixed offsets (few arguments per call: numba's dispatch costs per argument). A `Layout` is the one
place that says what each offset is: every slot has a name, a kind and a size, and the jit modules
take their integer constants from it (numba reads module-level ints when it compiles, so the
constants stay compile-time ints: no lookup on the hot path), so a reader or a tool
(`streammargin.describe_state`) can follow a number to its meaning:

    >>> from streammargin.jit.layout import COUNTER, HYPER, LEARNT, Layout, Slot
    >>> head = Layout("cache", Slot("size", COUNTER, "vectors stored"), Slot("gamma", HYPER))
    >>> layout = head.extend("model", Slot("scale", LEARNT), Slot("w", LEARNT, "weights", size=2))
    >>> layout.offsets("size", "gamma", "scale", "w"), layout.size
    ((0, 1, 2, 3), 5)
    >>> layout.span("w")
    slice(3, 5, None)
    >>> layout.read([3.0, 0.5, 1.0, 7.0, 8.0])
    {'size': 3.0, 'gamma': 0.5, 'scale': 1.0, 'w': [7.0, 8.0]}

Slots are laid out in order, without gaps, from offset 0; a layout may `extend` another one (a
model's own entries after the support cache's). Kinds: `HYPER` (written from the model's params:
the params are their source of truth; `param` names the constructor parameter a slot holds as it
is, `codes` maps a parameter's names to the numbers numba sees), `COUNTER` (whole numbers that
count steps, trials, draws), `LEARNT` (learnt scalars), `CALIBRATION` (the online Platt state of
`streammargin.jit.calibration`, itself a layout: `parts`).
"""

from __future__ import annotations

import typing

__all__ = ["CALIBRATION", "COUNTER", "HYPER", "KINDS", "LEARNT", "Layout", "Slot"]

HYPER = "hyper"
COUNTER = "counter"
LEARNT = "learnt"
CALIBRATION = "calibration"
KINDS = (HYPER, COUNTER, LEARNT, CALIBRATION)


class Slot(typing.NamedTuple):
    """A named entry (or `size` consecutive entries) of a state array.

    `param`: the constructor parameter a HYPER slot holds unchanged (numbers as floats, bools as
    0/1, names through `codes`); empty when the slot is derived from the params (its `doc` says
    how). `parts`: the layout of the slot's entries (the calibration's)."""

    name: str
    kind: str
    doc: str = ""
    size: int = 1
    param: str = ""
    codes: typing.Mapping[str, float] | None = None
    parts: Layout | None = None


class Layout:
    """Named slots at consecutive offsets of a float64 array, from offset 0 to `size`."""

    def __init__(self, title: str, *slots: Slot):
        self.title = title
        self.slots: tuple[Slot, ...] = slots
        self._offsets: dict[str, int] = {}
        self._slots: dict[str, Slot] = {}
        offset = 0
        for slot in slots:
            if slot.kind not in KINDS:
                raise ValueError(f"slot {slot.name!r} of {title}: unknown kind {slot.kind!r}")
            if slot.name in self._offsets:
                raise ValueError(f"slot {slot.name!r} of {title}: named twice")
            if slot.size < 1:
                raise ValueError(f"slot {slot.name!r} of {title}: size {slot.size} < 1")
            if slot.parts is not None and slot.parts.size != slot.size:
                raise ValueError(f"slot {slot.name!r} of {title}: its parts' size differs")
            self._offsets[slot.name] = offset
            self._slots[slot.name] = slot
            offset += slot.size
        self.size = offset  # the number of entries: the first offset after the last slot

    def extend(self, title: str, *slots: Slot) -> Layout:
        """This layout followed by `slots` (their offsets continue from `size`)."""
        return Layout(f"{self.title} + {title}", *self.slots, *slots)

    def offset(self, name: str) -> int:
        """The offset of slot `name` (its first entry)."""
        return self._offsets[name]

    def offsets(self, *names: str) -> tuple[int, ...]:
        """The offsets of the slots `names`, for a jit module's constants."""
        return tuple(self._offsets[name] for name in names)

    def span(self, name: str) -> slice:
        """The entries of slot `name`, as a slice of the state array."""
        start = self._offsets[name]
        return slice(start, start + self._slots[name].size)

    def slot(self, name: str) -> Slot:
        """The slot called `name`."""
        return self._slots[name]

    def names(self, kind: str | None = None) -> list[str]:
        """The slots' names, in order (of one kind)."""
        return [slot.name for slot in self.slots if kind is None or slot.kind == kind]

    def read(self, st: typing.Sequence[float], kind: str | None = None) -> dict[str, typing.Any]:
        """Slot name -> value of `st` (of the slots of one kind): a float, a list for a slot of
        several entries, a dict by name for a slot with `parts`."""
        if len(st) != self.size:
            raise ValueError(f"{self.title}: {len(st)} entries, the layout has {self.size}")
        out: dict[str, typing.Any] = {}
        for slot in self.slots:
            if kind is not None and slot.kind != kind:
                continue
            values = st[self.span(slot.name)]
            if slot.parts is not None:
                out[slot.name] = slot.parts.read(values)
            elif slot.size == 1:
                out[slot.name] = float(values[0])
            else:
                out[slot.name] = [float(v) for v in values]
        return out

    def __repr__(self) -> str:
        return f"Layout({self.title!r}, {len(self.slots)} slots, {self.size} entries)"
