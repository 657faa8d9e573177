"""Broken and inexact variants of a small float model, for tests/test_hardening_round3.py: the
workers import them by name. Each broken one ran to the end before, its only sign a gradient
error in the result table; each must now be refused before the run or fail it loudly.
"""
from __future__ import annotations

import multiprocessing
import os

import torch
import torch.nn.functional as F
from torch import nn

WIDTH = 8


def _stack(extra=()):
    return [nn.Linear(4, WIDTH), nn.Tanh(), *extra, nn.Linear(WIDTH, WIDTH), nn.Tanh(),
            nn.Linear(WIDTH, 2)]


def layers(seed):
    torch.manual_seed(seed)
    return _stack()


def loss(output, targets):
    return F.mse_loss(output, targets)


def batch(batch_size, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, 4, generator=g)
    return x, torch.stack([x.sum(1), x[:, 0] * x[:, 1]], 1)


# --- broken: refused before any worker starts -----------------------------------------------------
def pid_layers(seed):
    torch.manual_seed(seed + os.getpid())        # each process builds other weights
    return _stack()


def repeated_layers(seed):
    torch.manual_seed(seed)
    act = nn.Tanh()
    mid = nn.Linear(WIDTH, WIDTH)
    return [nn.Linear(4, WIDTH), act, mid, act, mid, nn.Linear(WIDTH, 2)]


def unseeded_batch(batch_size, seed):
    x = torch.randn(batch_size, 4)               # the global generator: another draw each call
    return x, x[:, :2]


def fixed_batch(batch_size, seed):
    g = torch.Generator().manual_seed(0)         # ignores its seed: every step the same batch
    x = torch.randn(batch_size, 4, generator=g)
    return x, x[:, :2]


def nan_batch(batch_size, seed):
    x, y = batch(batch_size, seed)
    x[0, 0] = float("nan")
    return x, y


def summed_loss(output, targets):
    return F.mse_loss(output, targets, reduction="sum")


def nan_loss(output, targets):
    return F.mse_loss(output, targets) * float("nan")


# --- broken where no check before the run can see it: the run fails loudly --------------------
class WorkerScale(nn.Module):
    """Doubles its input in a worker process only (the parent's reference sees x)."""

    def forward(self, x):
        return x * (2.0 if multiprocessing.parent_process() is not None else 1.0)


def worker_scaled_layers(seed):
    torch.manual_seed(seed)
    return _stack() + [WorkerScale()]


# --- inexact by design: run, announced before, marked NOT EXACT -------------------------------
def dropout_layers(seed):
    torch.manual_seed(seed)
    return _stack([nn.Dropout(0.5)])


def batchnorm_layers(seed):
    torch.manual_seed(seed)
    return _stack([nn.BatchNorm1d(WIDTH)])
