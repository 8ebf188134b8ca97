"""The data stream: a function of the workload alone (global batch, sequence length, seed).

Step ``s`` of a run sees the global batch ``batch(s)``: ``global_batch`` rows of ``seq_len + 1``
token ids (inputs are ``[:, :-1]``, targets ``[:, 1:]``). Which plan runs it does not matter;
a data-parallel rank takes its contiguous block of rows and splits it into micro-batches, so
any two plans of one workload train on exactly the same tokens, and a run resumed at step
``s`` continues with the tokens the interrupted run would have seen.

Two sources:

* synthetic (default): a random walk on a fixed sparse bigram table. The table (``FANOUT``
  successors per token) is drawn from the seed; each row starts at a random token and then
  picks one of the current token's successors at random, all from a ``torch.Generator``
  seeded by ``(seed, step)``. A model can learn it (the loss falls from ln(vocab) towards
  ln(FANOUT)), so runs show training and gradients carry signal;
* a token file: a flat numpy memmap of ids (``uint16`` or ``uint32``, the nanoGPT ``.bin``
  layout); row ``i`` of step ``s`` starts at an offset drawn by the same ``(seed, step)``
  generator.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .errors import DataError


FANOUT = 4


def token_dtype(requested: str, vocab: int) -> str:
    """The token file's id type: ``requested``, or with ``auto`` the smallest that holds every id of
    a ``vocab``-token vocabulary (uint16 holds 65,536 ids; Llama 3's 128,256 need uint32). A uint16
    file for a larger vocabulary is refused: its ids would wrap."""
    need = "uint16" if vocab <= 1 << 16 else "uint32"
    if requested in ("", "auto"):
        return need
    if requested == "uint16" and need == "uint32":
        raise DataError(f"token file dtype uint16 holds ids below 65536 and the model's vocabulary has {vocab}; "
                        "write the file as uint32 (--data-dtype uint32)")
    return requested


def _generator(seed: int, step: int) -> torch.Generator:
    # one stream per (seed, step); the constant spreads consecutive steps apart
    return torch.Generator().manual_seed((seed * 1_000_003 + step) & 0x7FFF_FFFF_FFFF_FFFF)


@dataclass(frozen=True)
class TokenStream:
    global_batch: int
    seq_len: int
    vocab: int
    seed: int = 0
    path: str = ""               # "" -> synthetic
    dtype: str = "uint16"

    def __post_init__(self) -> None:
        if self.path:
            import numpy as np
            if not os.path.exists(self.path):
                raise DataError(f"token file {self.path} does not exist")
            arr = np.memmap(self.path, dtype=self.dtype, mode="r")
            if len(arr) < self.seq_len + 2:
                raise DataError(f"token file {self.path} holds {len(arr)} tokens; a row needs "
                                f"seq_len + 1 = {self.seq_len + 1}")
            object.__setattr__(self, "_arr", arr)

    def batch(self, step: int) -> torch.Tensor:
        """The global batch of ``step``: int64 ``[global_batch, seq_len + 1]`` on the CPU."""
        g = _generator(self.seed, step)
        n, t = self.global_batch, self.seq_len + 1
        if not self.path:
            table = torch.randint(0, self.vocab, (self.vocab, FANOUT), dtype=torch.int64,
                                  generator=torch.Generator().manual_seed(self.seed & 0x7FFF_FFFF))
            pick = torch.randint(0, FANOUT, (n, t), generator=g, dtype=torch.int64)
            out = torch.empty(n, t, dtype=torch.int64)
            out[:, 0] = torch.randint(0, self.vocab, (n,), generator=g, dtype=torch.int64)
            for i in range(1, t):
                out[:, i] = table[out[:, i - 1], pick[:, i]]
            return out
        import numpy as np
        arr = self._arr   # type: ignore[attr-defined]
        starts = torch.randint(0, len(arr) - t + 1, (n,), generator=g).tolist()
        rows = np.stack([np.asarray(arr[s:s + t], dtype=np.int64) for s in starts])
        out = torch.from_numpy(rows)
        hi = int(out.max())
        if hi >= self.vocab:
            raise DataError(f"token file {self.path}: id {hi} at step {step} is beyond the model's "
                            f"vocabulary ({self.vocab})")
        return out

    def local(self, step: int, dp_rank: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This data-parallel rank's rows of ``step``: ``(inputs, targets)``, each
        ``[global_batch / dp, seq_len]``."""
        if self.global_batch % dp:
            raise DataError(f"global batch {self.global_batch} is not divisible by dp {dp}")
        per = self.global_batch // dp
        rows = self.batch(step)[dp_rank * per:(dp_rank + 1) * per]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


__all__ = ["TokenStream", "DataError"]
