"""An ordinary supervised PyTorch loop guarded by trimtab: the optimizer, the gradient clip,
the sentinel and a clamp on one activation, each a line or two, every bound measured.

    python examples/supervised.py --steps 500
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import trimtab
import trimtab.optim
from trimtab.clip import AdaptiveGradClip


class MLP(nn.Module):
    def __init__(self, features: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, guard=None) -> torch.Tensor:
        z = self.fc1(x)
        if guard is not None:
            guard(z)  # trimtab: check, then clamp the pre-activation at its measured p99
        return self.fc2(torch.relu(z)).squeeze(-1)


def main(steps: int = 500, device: str = "cpu", seed: int = 0) -> float:
    torch.manual_seed(seed)
    features = 32
    true_w = torch.zeros(features, device=device)
    true_w[:4] = torch.tensor([2.0, -1.0, 0.5, 3.0])  # only four input features matter
    net = MLP(features).to(device)

    # trimtab: optimizer (weight clamp, adaptive decay; L1 on the input layer), clip, sentinel.
    opt = trimtab.optim.Adam(
        [
            {"params": [net.fc1.weight], "l1": True, "weight_decay": 0.0},  # L1 regularises it
            {"params": [net.fc1.bias, *net.fc2.parameters()]},
        ],
        lr=3e-3,
    )
    clip = AdaptiveGradClip(net.parameters())
    sentinel = trimtab.Sentinel()
    sentinel.add("loss", lambda: loss.detach(), phase="forward")
    for name, p in net.named_parameters():
        sentinel.add(f"grad.{name}", lambda p=p: p.grad, phase="backward")
    sentinel.add("fc1.pre", None)  # fed by guard_ below
    # The activation bound is a state-vector slot: the EMA of the p99 |pre-activation|.
    sv = trimtab.StateVector([trimtab.Slot("act_bound")], device=device)
    act_ema = trimtab.AdaptiveEMA(1, device=device)

    def guard(z: torch.Tensor) -> None:
        with torch.no_grad():
            sv["act_bound"].copy_(act_ema.update(trimtab.abs_quantile(z, 0.99).reshape(1))[0])
            trimtab.guard_(z, sv["act_bound"], sentinel, "fc1.pre")

    for _ in range(steps):
        x = torch.randn(256, features, device=device)
        y = x @ true_w + 0.1 * torch.randn(256, device=device)
        loss = nn.functional.mse_loss(net(x, guard), y)
        sentinel.check("forward")
        opt.zero_grad()
        loss.backward()
        sentinel.check("backward")
        clip()  # adaptive gradient-norm clip; non-finite gradients zeroed and counted
        opt.step()
    sentinel.raise_if_fired()  # the only host read of the sentinel: once, at the end
    return loss.item()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    print(f"final loss {main(args.steps, args.device):.4f}")
