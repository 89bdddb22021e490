"""An ordinary supervised PyTorch loop guarded by trimtab: one ``trimtab.Guard`` does the
checks, the measured gradient clip, the non-finite answer and the folds; one named bound clamps
an activation inside the model (a layer from the Guard).

    python examples/supervised.py --steps 500
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import trimtab
import trimtab.optim


class MLP(nn.Module):
    def __init__(self, features: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.clamp: nn.Module = nn.Identity()  # the Guard's layer goes here (below)
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.clamp(self.fc1(x)))).squeeze(-1)


def main(steps: int = 500, device: str = "cpu", seed: int = 0) -> float:
    torch.manual_seed(seed)
    features = 32
    true_w = torch.zeros(features, device=device)
    true_w[:4] = torch.tensor([2.0, -1.0, 0.5, 3.0])  # only four input features matter
    net = MLP(features).to(device)
    opt = trimtab.optim.Adam(net.parameters(), lr=3e-3)  # weight clamp, self-set decay inside
    guard = trimtab.Guard(net, opt, bounds=["fc1_pre"])  # skip a non-finite step; clip
    net.clamp = guard.clamp_layer("fc1_pre")  # measured bound on the pre-activation

    for _ in range(steps):
        x = torch.randn(256, features, device=device)
        y = x @ true_w + 0.1 * torch.randn(256, device=device)
        loss = nn.functional.mse_loss(net(x), y)
        guard.step(loss)  # backward, checks, clip, optimizer step, folds: no host sync
    print(guard.report())  # the one host read: steps skipped, first non-finite tensor, bounds
    return loss.item()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    print(f"final loss {main(args.steps, args.device):.4f}")
