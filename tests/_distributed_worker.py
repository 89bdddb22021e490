"""One rank of tests/test_distributed.py (run as a script: ``python _distributed_worker.py
RANK WORLD STORE OUT``): a DDP model under trimtab's parts made rank-consistent, a NaN on rank 1,
and sharded clip and optimizer statistics against one process holding the whole tensors.
Writes its findings to ``OUT/rank{RANK}.pt``; the test compares the ranks' files."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trimtab.bounds import AdaptiveBounds, BoundClamp
from trimtab.clip import AdaptiveGradClip
from trimtab.distributed import RankConsistent
from trimtab.optim import Adam
from trimtab.sentinel import Rule, Sentinel

STEPS, NAN_RANK, NAN_STEP = 6, 1, 3


def model_run(rank: int, nan_at: int | None, headroom: float = 1.0) -> dict:
    """A DDP net whose hidden layer is clamped by an adaptive bound, the adaptive clip and
    trimtab's Adam; each rank draws its own data (seeded by rank). ``nan_at``: the step at
    which rank NAN_RANK writes a NaN into its hidden activations. ``headroom`` > 1: the test's
    exceedance counts are kept apart from the clamp's (both are reduced)."""
    torch.manual_seed(0)
    sentinel = Sentinel("cpu")
    bounds = AdaptiveBounds(["hidden", "out"], sentinel=sentinel, phase="forward",
                            headroom=headroom)  # fmt: skip
    clamp = BoundClamp(bounds, "hidden")
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), clamp, nn.Linear(16, 1))
    ddp = DDP(net)
    clip = AdaptiveGradClip(list(net.parameters()))
    opt = Adam(net.parameters(), lr=1e-2)
    for i, p in enumerate(net.parameters()):
        sentinel.add(f"weight.{i}", p, Rule.nonfinite(), phase="optimizer")
    rc = RankConsistent().attach(bounds, sentinel)
    data = torch.Generator().manual_seed(100 + rank)
    halted_at = None
    for step in range(STEPS):
        x = torch.randn(64, 8, generator=data) * (1 + rank)
        y = x.sum(dim=1, keepdim=True)
        if nan_at is not None and rank == NAN_RANK and step == nan_at:
            bounds.fault_hook = lambda name, h: h.view(-1)[5].fill_(float("nan"))
        else:
            bounds.fault_hook = None
        out = ddp(x)
        bounds.measure("out", out)
        bounds.clamp_("out", out.detach())
        loss = (out - y).square().mean()
        opt.zero_grad()
        loss.backward()
        clip()
        opt.step()
        sentinel.check("optimizer")
        rc.sync()  # the one collective of the step, before the folds
        bounds.fold()
        if bool(sentinel.fired()):  # every rank reads the same merged flags at this step
            halted_at = step
            break
    return {
        "bounds": bounds.values.clone(),
        "ema": bounds.ema.state_dict(),
        "clip": clip.bound.clone(),
        "adam": opt.state_vector.tensor.clone(),
        "weights": [p.detach().clone() for p in net.parameters()],
        "report": [f.to_dict() for f in sentinel.report()],
        "halted_at": halted_at,
    }


def sharded_statistics(rank: int, world: int) -> dict:
    """Each rank holds rows ``rank::world`` of every tensor (a FSDP-like shard); the clip and
    the optimizer reduce over the ranks. Rank 0 also runs one process on the whole tensors."""

    def tensors(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)
        ws = [torch.randn(12, 5, generator=g), torch.randn(7, generator=g)]
        gs = [torch.randn(12, 5, generator=g) * 3, torch.randn(7, generator=g)]
        return ws, gs

    def run(shard: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        params = [w.clone() for w in tensors(0)[0]]
        if shard:
            params = [p[rank::world].clone() for p in params]
        params = [nn.Parameter(p) for p in params]
        clip = AdaptiveGradClip(params)
        opt = Adam([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}], lr=0.1)
        if shard:
            RankConsistent().attach_clip(clip).attach_optimizer(opt)
        norms = []
        for step in range(4):
            grads = tensors(step + 1)[1]
            for p, g in zip(params, grads):
                p.grad = g[rank::world].clone() if shard else g.clone()
            norms.append(clip())
            opt.step()
        return torch.stack(norms), clip.bound.clone(), opt.state_vector.tensor.clone()

    out = dict(zip(("norms", "clip", "adam"), run(shard=True)))
    if rank == 0:
        out["whole"] = dict(zip(("norms", "clip", "adam"), run(shard=False)))
    return out


def fsdp_run(rank: int, world: int) -> dict:
    """A real FSDP model (FullyShardedDataParallel: each rank holds half of one flat parameter)
    with the adaptive clip and trimtab's Adam made rank-consistent (attach_clip,
    attach_optimizer), each rank on its own data; rank 0 also runs the same net unsharded in
    one process on both ranks' data (the same mean gradient)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))  # 178 = 2 x 89

    def batches(r: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(200 + r)
        return [torch.randn(32, 8, generator=g) * (1 + r) for _ in range(STEPS)]

    def train(net: nn.Module, params: list[nn.Parameter], data: list[torch.Tensor], rc: bool):
        clip = AdaptiveGradClip(params)
        opt = Adam(params, lr=1e-2)
        if rc:
            RankConsistent().attach_clip(clip).attach_optimizer(opt)
        for x in data:
            loss = (net(x) - x[:, :2]).square().mean()
            opt.zero_grad()
            loss.backward()
            clip()
            opt.step()
        return clip.bound.clone(), opt.state_vector.tensor.clone()

    model = FSDP(make(), device_id=torch.device("cpu"), use_orig_params=False)
    clip, adam = train(model, list(model.parameters()), batches(rank), rc=True)
    with FSDP.summon_full_params(model):
        weights = [p.detach().clone() for p in model.parameters()]
    out = {"clip": clip, "adam": adam, "weights": torch.cat([w.reshape(-1) for w in weights])}
    if rank == 0:  # the union of both ranks' batches: the mean of their mean gradients
        net = make()
        union = [torch.cat(xs) for xs in zip(*(batches(r) for r in range(world)))]
        clip, adam = train(net, list(net.parameters()), union, rc=False)
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        out["whole"] = {"clip": clip, "adam": adam, "weights": flat}
    return out


def main() -> None:
    rank, world, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    result = {
        "consistent": model_run(rank, nan_at=None, headroom=2.0),
        "nan": model_run(rank, nan_at=NAN_STEP),
        "sharded": sharded_statistics(rank, world),
        "fsdp": fsdp_run(rank, world),
    }
    torch.save(result, f"{out}/rank{rank}.pt")
    dist.barrier()  # both ranks' files are written
    # Leave without the interpreter's teardown: tearing down gloo's worker threads once aborted
    # a rank on the loaded 2-core CI machine ("terminate called without an active exception",
    # SIGABRT) after every collective had finished; what the test reads is saved above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
