"""The training loss: summed next-token cross-entropy in fp32, one definition for every caller.

The sum (not the mean) over a micro-batch's real targets is what the Trainer
accumulates and divides by the window's target count, so gradient
accumulation is exact however real tokens are spread over micro-batches.
``LlamaForCausalLM.forward(..., targets=…)`` returns it, so a whole-model
torch.compile takes the loss into the same graph as the model: Inductor then
fuses the fp32 cast, log-softmax and their backward over the (B·T, V) logits
instead of writing each step of it to memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core.data import IGNORE_INDEX


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over real targets of -log p(target), in fp32 whatever the logits' dtype; (B, T, V), (B, T) -> ()."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")
