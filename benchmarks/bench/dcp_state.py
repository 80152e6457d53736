"""``bench --dcp``'s workload: each rank's part of an MLP and its Adam state,
sharded by hand, built the same on every run, and the checks that a restore gave
it back.

Apart from ``dcp_path`` (which runs the contenders and reports them) because the
state is what every contender saves and restores, and the Train loop builds it in
each rank: one job, the workload, and one for the runs.
"""

from __future__ import annotations

from typing import Any

from benchmarks.units import MiB

WORLD = 2  # ranks
SIDE = 1024  # each layer's weight: SIDE x SIDE float32, 4 MiB


def layer_count(mib: int) -> int:
    """Layers of the MLP for ``mib`` MiB of weights: even (each rank owns half), >= 2."""
    return max(WORLD, round(mib * MiB / (SIDE * SIDE * 4) / WORLD) * WORLD)


def sharded_state(rank: int, layers: int) -> dict[str, Any]:
    """Rank ``rank``'s part of the model and its Adam state after one step: the
    layers ``i % WORLD == rank``, the same on every run (seeded by layer)."""
    import torch

    mine = [i for i in range(layers) if i % WORLD == rank]
    modules = []
    for i in mine:
        torch.manual_seed(i)
        modules.append(torch.nn.Linear(SIDE, SIDE))
    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-3)
    sum(p.pow(2).sum() for p in params).backward()  # type: ignore[union-attr]
    optimizer.step()
    state: dict[str, Any] = {"step": 1}
    for i, m in zip(mine, modules, strict=True):
        for name, p in m.named_parameters():
            key = f"layers.{i}.{name}"
            state[f"model.{key}"] = p.detach()
            for moment in ("exp_avg", "exp_avg_sq"):
                state[f"optim.{key}.{moment}"] = optimizer.state[p][moment]
    return state


def zeroed(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else -1 for k, v in state.items()}


def equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(
        torch.equal(v, b[k]) if isinstance(v, torch.Tensor) else v == b[k] for k, v in a.items()
    )
