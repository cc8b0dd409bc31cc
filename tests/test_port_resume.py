"""A team's own Horovod script, the way teams write them (a Dataset class, an MLP with BatchNorm and dropout, SGD with
momentum and weight decay, ReduceLROnPlateau, metrics averaged with hvd.allreduce(name=...), a save_checkpoint helper
the model reaches state_dict() through, rank-0 resume with broadcast_object / broadcast_parameters /
broadcast_optimizer_state): its port trains at 2 ranks, writes a checkpoint with the model's own keys, and resumes
from it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from ddp_train.port.__main__ import main as port_main
from launched import PY, run_cmd

pytestmark = pytest.mark.timeout(600)

SCRIPT = textwrap.dedent('''
    """Train an MLP on synthetic tabular data with Horovod."""
    import argparse
    import os

    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data.distributed import DistributedSampler

    import horovod.torch as hvd


    class Tabular(Dataset):
        def __init__(self, n, seed):
            rng = np.random.default_rng(seed)
            self.x = torch.tensor(rng.normal(size=(n, 10)), dtype=torch.float32)
            self.y = torch.tensor((self.x[:, 0] + self.x[:, 1] > 0).long().numpy())

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.x[i], self.y[i]


    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(10, 32)
            self.bn1 = nn.BatchNorm1d(32)
            self.drop = nn.Dropout(0.1)
            self.fc2 = nn.Linear(32, 2)

        def forward(self, x):
            return self.fc2(self.drop(F.relu(self.bn1(self.fc1(x)))))


    def save_checkpoint(path, epoch, model, optimizer, scheduler):
        torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict()}, path)


    def average(value, name):
        return hvd.allreduce(torch.tensor(value), name=name).item()


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, default=2)
        parser.add_argument("--checkpoint", default="checkpoint.pt")
        parser.add_argument("--resume", action="store_true")
        args = parser.parse_args()

        hvd.init()
        torch.manual_seed(0)
        data = Tabular(256, seed=1)
        sampler = DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank())
        loader = DataLoader(data, batch_size=16, sampler=sampler)
        model = MLP()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9, weight_decay=1e-4)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=1)
        start = 0
        if args.resume and hvd.rank() == 0:
            state = torch.load(args.checkpoint, weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            start = state["epoch"] + 1
        start = hvd.broadcast_object(start, root_rank=0)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

        for epoch in range(start, start + args.epochs):
            sampler.set_epoch(epoch)
            model.train()
            total = 0.0
            for x, y in loader:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                total += loss.item()
            mean = average(total / len(loader), "train_loss")
            scheduler.step(mean)
            if hvd.rank() == 0:
                print(f"epoch {epoch} loss {mean:.4f}", flush=True)
                save_checkpoint(args.checkpoint, epoch, model, optimizer, scheduler)


    if __name__ == "__main__":
        main()
''')


@pytest.fixture(scope="module")
def ported(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("port_resume")
    (folder / "train_horovod.py").write_text(SCRIPT)
    assert port_main([str(folder / "train_horovod.py"), "-o", str(folder / "train_ddp.py"), "--report-json",
                      str(folder / "port.json")]) == 0
    return folder


def torchrun(folder: Path, *args: str):
    return run_cmd([str(Path(PY).parent / "torchrun"), "--rdzv-backend", "loopback", "--nproc-per-node", "2",
                    "train_ddp.py", *args], timeout=240, cwd=folder)


def test_the_ports_checkpoint_keeps_the_models_keys_and_resumes(ported):
    report = json.loads((ported / "port.json").read_text())
    assert any("keep_model_keys(model)" in change["text"] for change in report["changes"])
    first = torchrun(ported, "--epochs", "1").check()
    assert "epoch 0 loss" in first.output
    state = torch.load(ported / "checkpoint.pt", weights_only=True)
    expected = ["fc1.weight", "fc1.bias", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
                "bn1.num_batches_tracked", "fc2.weight", "fc2.bias"]
    assert list(state["model"]) == expected, list(state["model"])  # what the Horovod script's checkpoint holds
    resumed = torchrun(ported, "--epochs", "1", "--resume").check()
    assert "epoch 1 loss" in resumed.output and "Missing key" not in resumed.output
    again = torch.load(ported / "checkpoint.pt", weights_only=True)
    assert again["epoch"] == 1 and list(again["model"]) == expected
