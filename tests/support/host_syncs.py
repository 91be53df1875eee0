"""Record the torch calls that would make the host wait for a GPU (a device-to-host read of
values: `.tolist()`, `.item()`, truth values, boolean-mask indexing, `torch.unique`,
`nonzero`, `bincount`, `repeat_interleave` by a tensor, `.cpu()`), made from given source
files. On a CPU run nothing waits, but the calls are the same: a code path without them
cannot sync on a GPU either.

The calls are wrapped where they live (torch.Tensor's methods, torch's functions) while
the recorder is open, so every thread sees the wrappers: autograd runs backward hooks
where a TorchFunctionMode is not active."""
from __future__ import annotations

import functools
import sys
import time

import torch

_METHODS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "nonzero",
            "unique", "bincount", "masked_select", "cpu", "numpy", "any", "all")
_FUNCTIONS = ("unique", "unique_consecutive", "nonzero", "bincount", "masked_select")


def _bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class HostSyncRecorder:
    """`with HostSyncRecorder(*files) as rec:` ...; `rec.found`: (call, file:line) of each
    syncing call made from a frame of one of `files`. With `direct=True` only calls made
    by code of those files itself count (not those of a model they call), each found as
    (call, file:line, time.monotonic_ns()), the timeline's clock."""

    def __init__(self, *files: str, direct: bool = False) -> None:
        self.files, self.found, self.direct = files, [], direct
        self._saved: list[tuple[object, str, object]] = []

    def _wrap(self, owner, name: str, syncs=lambda args: True) -> None:
        real = getattr(owner, name)

        @functools.wraps(real)
        def call(*args, **kwargs):
            if syncs(args):
                where = self._caller()
                if where is not None:
                    self.found.append((name, where, time.monotonic_ns()) if self.direct else (name, where))
            return real(*args, **kwargs)
        self._saved.append((owner, name, real))
        setattr(owner, name, call)

    def __enter__(self) -> "HostSyncRecorder":
        for name in _METHODS:
            self._wrap(torch.Tensor, name)
        for name in _FUNCTIONS:
            self._wrap(torch, name)
        for name in ("__getitem__", "__setitem__"):
            self._wrap(torch.Tensor, name, lambda args: len(args) > 1 and _bool_index(args[1]))
        self._wrap(torch.Tensor, "repeat_interleave", lambda args: len(args) > 1 and isinstance(args[1], torch.Tensor))
        self._wrap(torch, "repeat_interleave", lambda args: len(args) > 1 and isinstance(args[1], torch.Tensor))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, real in reversed(self._saved):
            setattr(owner, name, real)
        self._saved = []

    def _caller(self) -> str | None:
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename.endswith(self.files):
                return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
            if self.direct:
                return None
            frame = frame.f_back
        return None
