"""How the training step holds its numbers: the leads issue 16 profiled on an H100.

Plain PyTorch, used by the worker loop (:mod:`santa.train.loop`) and ``bench/perf/gpu.py`` alike,
each behind a ``train`` config switch:

- ``bf16_weights`` (:class:`MasterWeights`): the model that runs forward and backward holds
  bf16 weights, the optimizer an fp32 master copy. Autocast on fp32 weights casts every
  weight to bf16 in every op of every step (23 % of eager GPU time at T5-base); here the
  cast happens once per step, after the optimizer. Autocast stays on for what it keeps in
  fp32 (softmax, cross-entropy, norms). Checkpoints, the optimizer state and evaluation
  use the fp32 master, so they are what they were.
- ``fused_rms_norm`` (:func:`use_fused_rms_norm`): T5's RMS layer norm through
  ``torch.nn.functional.rms_norm`` (one fused kernel on CUDA) instead of five ops.
- ``bf16_position_bias`` (:func:`use_bf16_position_bias`): T5's relative position bias,
  computed once per stack and added to every layer's scores, comes out of its embedding in
  the autocast dtype instead of fp32 (which every attention layer then casts).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "FusedRMSNorm",
    "MasterWeights",
    "use_bf16_position_bias",
    "use_fused_rms_norm",
]

_HALF = (torch.float16, torch.bfloat16)
# transformers' RMS norm classes of the T5 family (same forward, same parameter).
_T5_NORMS = ("T5LayerNorm", "MT5LayerNorm", "UMT5LayerNorm")


class FusedRMSNorm(nn.Module):
    """T5's layer norm (RMS, no mean, no bias) as one ``F.rms_norm`` call; same parameter.

    As transformers' version: statistics in fp32, the result cast to the weight's dtype
    when that is half precision.
    """

    def __init__(self, weight: nn.Parameter, eps: float) -> None:
        super().__init__()
        self.weight = weight
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = (hidden_states.shape[-1],)
        weight = self.weight
        if hidden_states.dtype == weight.dtype:
            return F.rms_norm(hidden_states, shape, weight, self.variance_epsilon)
        normed = F.rms_norm(hidden_states.float(), shape, weight.float(), self.variance_epsilon)
        return normed.to(weight.dtype) if weight.dtype in _HALF else normed


def use_fused_rms_norm(model: nn.Module) -> int:
    """Swap every T5 RMS layer norm of ``model`` for :class:`FusedRMSNorm` (the parameters
    and state-dict keys stay); returns how many were swapped."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__ in _T5_NORMS:
                setattr(parent, name, FusedRMSNorm(child.weight, child.variance_epsilon))
                swapped += 1
    return swapped


def _bias_in_autocast_dtype(module: nn.Module, inputs, output: torch.Tensor) -> torch.Tensor:
    device = output.device.type
    if torch.is_autocast_enabled(device):
        return output.to(torch.get_autocast_dtype(device))
    return output


def use_bf16_position_bias(model: nn.Module) -> int:
    """Make T5's relative-position-bias embeddings return the autocast dtype under
    autocast (unchanged outside it); returns how many embeddings were hooked."""
    hooked = 0
    for module in model.modules():
        embedding = getattr(module, "relative_attention_bias", None)
        if isinstance(embedding, nn.Embedding):
            embedding.register_forward_hook(_bias_in_autocast_dtype)
            hooked += 1
    return hooked


class MasterWeights:
    """bf16 weights for forward and backward, an fp32 master copy for the optimizer.

    ``master`` is the model as built (fp32): the optimizer steps its parameters, and
    checkpoints, evaluation and the miner's snapshots read it. :attr:`compute` is a copy
    in ``dtype`` that the step runs (wrap it in DDP, compile it). After backward,
    :meth:`gradients_to_master` moves the gradients onto the master (in fp32); after the
    optimizer, :meth:`weights_to_compute` copies the master back, rounded.
    """

    def __init__(self, master: nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
        self.master = master
        self.compute = copy.deepcopy(master).to(dtype)
        master_parameters = dict(master.named_parameters())
        self.pairs = [
            (parameter, master_parameters[name])
            for name, parameter in self.compute.named_parameters()
        ]

    def gradients_to_master(self) -> None:
        """The compute model's gradients, in fp32, as the master's (theirs are cleared)."""
        for compute, master in self.pairs:
            if compute.grad is None:
                master.grad = None
                continue
            master.grad = compute.grad.to(master.dtype)
            compute.grad = None

    @torch.no_grad()
    def weights_to_compute(self) -> None:
        """Copy the master's weights (after the optimizer step) into the compute model."""
        for compute, master in self.pairs:
            compute.copy_(master)
