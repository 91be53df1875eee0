"""Record the torch calls that would make the host wait for a GPU (a device-to-host
read of values: `.tolist()`, `.item()`, truth values, boolean-mask indexing,
`torch.unique`, `nonzero`, `bincount`, `repeat_interleave` by a tensor, `.cpu()`), made
from given source files. On a CPU run nothing waits, but the calls are the same: a code
path without them cannot sync on a GPU either. A TorchFunctionMode sees every torch call
of its thread, autograd hooks run during a CPU backward included."""
from __future__ import annotations

import sys

import torch
from torch.overrides import TorchFunctionMode

_ALWAYS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
           torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero,
           torch.unique, torch.Tensor.unique, torch.unique_consecutive, torch.bincount,
           torch.Tensor.bincount, torch.masked_select, torch.Tensor.masked_select,
           torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.any, torch.Tensor.all}
_INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}
_REPEATS = {torch.repeat_interleave, torch.Tensor.repeat_interleave}


def _bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class HostSyncRecorder(TorchFunctionMode):
    """`found`: (call, file:line) of each syncing call made from a frame of `files`."""

    def __init__(self, *files: str) -> None:
        super().__init__()
        self.files, self.found = files, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._syncs(func, args):
            where = self._caller()
            if where is not None:
                self.found.append((getattr(func, "__name__", str(func)), where))
        return func(*args, **kwargs)

    @staticmethod
    def _syncs(func, args) -> bool:
        if func in _ALWAYS:
            return True
        if func in _INDEXING:
            return len(args) > 1 and _bool_index(args[1])
        if func in _REPEATS:
            return len(args) > 1 and isinstance(args[1], torch.Tensor)
        return False

    def _caller(self) -> str | None:
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename.endswith(self.files):
                return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
            frame = frame.f_back
        return None
