"""Datasets that DataLoader workers started with ``spawn`` unpickle: their module imports torch only, so each worker
imports torch and nothing else of the test session (JAX, the bridge, the test module)."""
import torch
from torch.utils.data import Dataset


class PairDataset(Dataset):
    """Example i is (float64 features, int64 label i)."""

    def __init__(self, n: int = 12, dim: int = 3):
        self.n, self.dim = n, dim

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((self.dim,), float(i), dtype=torch.float64), torch.tensor(i, dtype=torch.int64)
