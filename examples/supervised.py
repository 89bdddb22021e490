"""An ordinary supervised PyTorch loop guarded by trimtab: the optimizer, the gradient clip,
the sentinel and a measured clamp on one activation (an AdaptiveBounds layer), each a line or
two, every bound measured.

    python examples/supervised.py --steps 500
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import trimtab
import trimtab.optim
from trimtab.bounds import AdaptiveBounds, BoundClamp
from trimtab.clip import AdaptiveGradClip


class MLP(nn.Module):
    def __init__(self, clamp: nn.Module, features: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.clamp = clamp  # trimtab: measure, check, then clamp the pre-activation
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.clamp(self.fc1(x)))).squeeze(-1)


def main(steps: int = 500, device: str = "cpu", seed: int = 0) -> float:
    torch.manual_seed(seed)
    features = 32
    true_w = torch.zeros(features, device=device)
    true_w[:4] = torch.tensor([2.0, -1.0, 0.5, 3.0])  # only four input features matter
    sentinel = trimtab.Sentinel(device)
    # trimtab: the activation bound (p99 |pre-activation| -> engagement raise -> adaptive EMA ->
    # slot), checked into sentinel slot "fc1_pre" before each clamp
    bounds = AdaptiveBounds(["fc1_pre"], device=device, sentinel=sentinel)
    net = MLP(BoundClamp(bounds, "fc1_pre"), features).to(device)

    # trimtab: optimizer (weight clamp, adaptive decay; L1 on the input layer), clip, sentinel.
    opt = trimtab.optim.Adam(
        [
            {"params": [net.fc1.weight], "l1": True, "weight_decay": 0.0},  # L1 regularises it
            {"params": [net.fc1.bias, *net.fc2.parameters()]},
        ],
        lr=3e-3,
    )
    clip = AdaptiveGradClip(net.parameters())
    sentinel.add("loss", lambda: loss.detach(), phase="loss")
    for name, p in net.named_parameters():
        sentinel.add(f"grad.{name}", lambda p=p: p.grad, phase="backward")

    for _ in range(steps):
        x = torch.randn(256, features, device=device)
        y = x @ true_w + 0.1 * torch.randn(256, device=device)
        loss = nn.functional.mse_loss(net(x), y)  # trimtab: the clamp layer measures and clamps
        sentinel.check("loss")
        opt.zero_grad()
        loss.backward()
        sentinel.check("backward")
        clip()  # adaptive gradient-norm clip; non-finite gradients zeroed and counted
        opt.step()
        bounds.fold()  # trimtab: fold this step's measurement into the activation bound
    sentinel.raise_if_fired()  # the only host read of the sentinel: once, at the end
    return loss.item()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    print(f"final loss {main(args.steps, args.device):.4f}")
