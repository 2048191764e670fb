"""A small GPT-style model and its mock data, sized to train on two CPU cores.

Mock data is a pure function of the global sample index: sample i is an arithmetic
progression of tokens whose start and stride come from (seed, i). So a resumed run
sees exactly the batches the interrupted one would have, the data position is one
number (samples consumed), and the loss falls as the model learns to continue a
progression, which makes a resume visible in the loss.
"""

from __future__ import annotations

import torch
from torch import nn

MAX_STRIDE = 8


def mock_sample(index: int, seq_length: int, vocab_size: int, seed: int) -> torch.Tensor:
    """seq_length + 1 tokens: inputs are [:-1], labels [1:]."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    start = int(torch.randint(vocab_size, (1,), generator=gen))
    stride = int(torch.randint(1, MAX_STRIDE, (1,), generator=gen))
    return (start + stride * torch.arange(seq_length + 1)) % vocab_size


def mock_batch(
    indices: range, seq_length: int, vocab_size: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.stack([mock_sample(i, seq_length, vocab_size, seed) for i in indices])
    return tokens[:, :-1], tokens[:, 1:]


class TinyGPT(nn.Module):
    """Token and position embeddings, pre-norm causal transformer blocks, an LM head."""

    causal_mask: torch.Tensor  # a registered buffer: moves with the module, never saved

    def __init__(
        self, vocab_size: int, seq_length: int, hidden: int, layers: int, heads: int
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, hidden)
        self.positions = nn.Embedding(seq_length, hidden)
        block = nn.TransformerEncoderLayer(
            hidden, heads, dim_feedforward=4 * hidden, dropout=0.0, batch_first=True,
            norm_first=True,
        )  # fmt: skip
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab_size, bias=False)
        mask = nn.Transformer.generate_square_subsequent_mask(seq_length)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        length = inputs.shape[1]
        positions = torch.arange(length, device=inputs.device)
        x = self.tokens(inputs) + self.positions(positions)
        x = self.blocks(x, mask=self.causal_mask[:length, :length], is_causal=True)
        return self.head(self.norm(x))


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
