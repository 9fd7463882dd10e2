"""A device-placement guard for forwards on torch's `meta` device (the stand-in for a GPU here).

`DeviceGuard()` is a torch dispatch mode: inside it, every aten op that mixes a tensor on the
guarded device with a tensor elsewhere fails with `WrongDevice` naming the op (a 0-dim CPU tensor
is a scalar and may go anywhere, as on a GPU; copies between devices are the one legal crossing).
Plain torch is laxer on `meta` (an embedding lookup or an index with CPU indices passes there and
fails, or syncs, on a GPU), so this catches every tensor a family creates on the wrong device. A
copy off the meta device comes back as zeros of its shape and dtype (meta tensors hold no data),
so a whole forward, numpy answers included, runs through.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten
COPIES = frozenset({aten._to_copy, aten.to, aten.copy_, aten._copy_from, aten._copy_from_and_resize})


def _target(args: Any, kwargs: Any, kind: type) -> Any:
    """The device (or dtype) a copy goes to: a keyword, else the first such positional argument."""
    key = "device" if kind is torch.device else "dtype"
    if kwargs.get(key) is not None:
        return kwargs[key]
    return next((a for a in args[1:] if isinstance(a, kind)), None)


class WrongDevice(RuntimeError):
    pass


class DeviceGuard(TorchDispatchMode):
    def __init__(self, device: str = "meta") -> None:
        super().__init__()
        self.device = torch.device(device).type
        self.device_ops = 0  # ops that ran on the guarded device
        self.host_copies = 0  # copies off it (answers going back to the host)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        devices = {t.device.type for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
        if func.overloadpacket in COPIES:
            source = args[0] if args and isinstance(args[0], torch.Tensor) else None
            target = _target(args, kwargs, torch.device)
            leaving = source is not None and source.device.type == self.device
            if leaving and target is not None and torch.device(target).type == "cpu":
                assert source is not None
                self.host_copies += 1
                return torch.zeros(source.shape, dtype=_target(args, kwargs, torch.dtype) or source.dtype)
        elif self.device in devices and len(devices) > 1:
            raise WrongDevice(f"{func} mixes devices {sorted(devices)}")
        if self.device in devices:
            self.device_ops += 1
        return func(*args, **kwargs)
