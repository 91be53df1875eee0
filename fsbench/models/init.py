"""Deterministic weight initialization, independent of the global RNG.

Every parameter draws from its own generator, seeded from (run seed, parameter name).
That makes the initial weights
  * identical on every process (no dependence on what else consumed random numbers),
  * independent of the rest of the model: the embedding tables start the same whatever
    the dense family is, and a trainer that builds a sharded copy of a table can
    reproduce its weights from the table name alone (`sparse.initial_table_weight`).
Hazard: the name must be hashed with a stable hash; Python's `hash()` is salted per
process and would give every rank different weights.
"""
from __future__ import annotations

import hashlib

import torch
from torch import nn


def param_generator(seed: int, name: str) -> torch.Generator:
    """A CPU generator seeded from (seed, name) with a process-independent hash."""
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


@torch.no_grad()
def normal_(param: torch.Tensor, std: float, seed: int, name: str) -> None:
    """Fill `param` in place with N(0, std^2) drawn on the CPU (same values on any device)."""
    param.copy_(normal_values(param.shape, std, seed, name))


def normal_values(shape, std: float, seed: int, name: str) -> torch.Tensor:
    """The float64 values `normal_` fills (scaled in place: one full-size buffer, not two)."""
    values = torch.randn(shape, generator=param_generator(seed, name), dtype=torch.float64)
    return values.mul_(std)


@torch.no_grad()
def init_module_(module: nn.Module, seed: int, prefix: str) -> None:
    """Initialize every parameter of `module` by the kind of module that owns it.

    Linear weights ~ N(0, 1/fan_in) and biases 0; LayerNorm is the identity; Embedding rows
    ~ N(0, 1/dim) (so dot products of unit-scale vectors start near N(0, 1)); parameters
    a module lists in its `zero_init` tuple start at 0. Anything else raises, so a new
    parameter can never keep the uninitialized memory left by `materialize`.
    """
    for name, param in module.named_parameters():
        owner_name, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_name)
        if isinstance(owner, nn.LayerNorm):
            param.fill_(1.0 if leaf == "weight" else 0.0)
        elif isinstance(owner, nn.Linear) and leaf == "bias":
            param.zero_()
        elif isinstance(owner, nn.Linear | nn.Embedding):
            normal_(param, param.shape[1] ** -0.5, seed, prefix + name)
        elif leaf in getattr(owner, "zero_init", ()):
            param.zero_()
        else:
            raise TypeError(f"no initialization rule for parameter {prefix}{name} "
                            f"of {type(owner).__name__}")


def uninitialized_embedding(num_rows: int, dim: int, padding_idx: int | None = None) -> nn.Embedding:
    """An nn.Embedding whose weight is left as allocated (on the meta device: no memory).
    Every model here is built on the meta device and then initialized explicitly
    (`init_weights`), so nn.Embedding's own N(0, 1) init would be discarded; on the meta
    device it also costs about a second per process (torch's meta `normal_` imports
    torch._dynamo), paid by every rank and every CLI call."""
    return nn.Embedding(num_rows, dim, padding_idx=padding_idx, _weight=torch.empty(num_rows, dim))


def materialize(module: nn.Module, device: str | torch.device = "cpu") -> nn.Module:
    """`module` (built on the meta device) with every parameter allocated, uninitialized,
    on `device`; returns it. What `Module.to_empty` does, without its meta `empty_like`,
    which imports sympy (half a second per process). A parameter shared by several modules
    stays shared, as `to_empty` keeps it. The models here hold no buffers."""
    made: dict[int, nn.Parameter] = {}
    for owner in module.modules():
        for name, p in list(owner.named_parameters(recurse=False)):
            if id(p) not in made:
                made[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device),
                                           requires_grad=p.requires_grad)
            setattr(owner, name, made[id(p)])
    if any(True for _ in module.buffers()):
        raise TypeError(f"{type(module).__name__} holds buffers: materialize them too")
    return module
