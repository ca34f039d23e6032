"""The training step's precision switches (santa.train.precision), checked on CPU against
transformers' own T5 and a plain fp32 step."""

from __future__ import annotations

import torch
from transformers import T5Config, T5ForConditionalGeneration
from transformers.models.t5.modeling_t5 import T5LayerNorm

from santa.config import ModelConfig
from santa.method.losses import contrastive_loss, total_loss
from santa.models.dual_encoder import DualEncoder
from santa.train.precision import (
    FusedRMSNorm,
    MasterWeights,
    use_bf16_position_bias,
    use_fused_rms_norm,
)

VOCAB = 300


def tiny_model(seed: int = 0) -> DualEncoder:
    config = T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    torch.manual_seed(seed)
    return DualEncoder(T5ForConditionalGeneration(config), ModelConfig(backbone="t"))


def batch(seed: int = 1, rows: int = 6) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    queries = torch.randint(2, VOCAB, (rows, 12), generator=generator)  # (rows, 12)
    documents = torch.randint(2, VOCAB, (rows, 20), generator=generator)  # (rows, 20)
    labels = torch.randint(2, VOCAB, (rows, 8), generator=generator)  # (rows, 8)
    return {
        "query_input_ids": queries,
        "query_attention_mask": torch.ones_like(queries),
        "masked_document_input_ids": documents,
        "masked_document_attention_mask": torch.ones_like(documents),
        "mep_labels": labels,
    }


def loss_of(model, inputs) -> torch.Tensor:
    output = model(**inputs)
    sda = contrastive_loss(output.query_embeddings, output.doc_embeddings)
    return total_loss(sda, output.mep_loss, 1.0)


def test_fused_rms_norm_is_t5s_layer_norm() -> None:
    reference = T5LayerNorm(16, eps=1e-6)
    with torch.no_grad():
        reference.weight.uniform_(0.5, 1.5)
    fused = FusedRMSNorm(reference.weight, reference.variance_epsilon)
    hidden = torch.randn(3, 5, 16) * 4  # (batch, length, d)
    torch.testing.assert_close(fused(hidden), reference(hidden), rtol=1e-6, atol=1e-6)
    # bf16 weights (the bf16_weights switch): same dtype out, within bf16's rounding.
    reference.to(torch.bfloat16)
    for given in (hidden, hidden.to(torch.bfloat16)):
        got, expected = fused(given), reference(given)
        assert got.dtype == expected.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2, atol=1e-2)


def test_swapping_the_norms_keeps_the_parameters_and_the_outputs() -> None:
    model, reference = tiny_model(), tiny_model()
    keys = list(model.state_dict())
    parameters = {id(p) for p in model.parameters()}
    # encoder: 2 per layer + the final one; decoder: 3 per layer + the final one
    assert use_fused_rms_norm(model) == 2 * 2 + 1 + 2 * 3 + 1
    assert list(model.state_dict()) == keys
    assert {id(p) for p in model.parameters()} == parameters  # the optimizer's stay valid
    inputs = batch()
    torch.testing.assert_close(loss_of(model, inputs), loss_of(reference, inputs))


def test_position_bias_comes_out_in_the_autocast_dtype_and_changes_little() -> None:
    model, reference = tiny_model(), tiny_model()
    assert use_bf16_position_bias(model) == 2  # the first layer of each stack has one
    seen: list[torch.dtype] = []
    embedding = model.backbone.encoder.block[0].layer[0].SelfAttention.relative_attention_bias
    embedding.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    inputs = batch()
    with torch.no_grad():
        torch.testing.assert_close(loss_of(model, inputs), loss_of(reference, inputs))  # fp32
        assert seen == [torch.float32, torch.float32]  # query and document pass
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, expected = loss_of(model, inputs), loss_of(reference, inputs)
    assert seen[-1] == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_bf16_weights_with_an_fp32_master_train_like_fp32() -> None:
    """The master copy is what the optimizer steps and checkpoints save; the compute copy
    is its rounding; the gradients match an fp32 step's and the loss goes down."""
    model, reference = tiny_model(), tiny_model()
    master = MasterWeights(model)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in master.compute.parameters())
    inputs = batch()

    loss_of(reference, inputs).backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_of(master.compute, inputs)
    loss.backward()
    master.gradients_to_master()
    assert all(p.grad is None for p in master.compute.parameters())
    for (name, got), expected in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert got.grad.dtype == torch.float32
        cosine = torch.nn.functional.cosine_similarity(
            got.grad.flatten(), expected.grad.flatten(), dim=0
        )
        assert cosine > 0.97, (name, float(cosine))

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_of(master.compute, inputs)
        loss.backward()
        master.gradients_to_master()
        optimizer.step()
        master.weights_to_compute()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.8 * losses[0], losses
    for compute, fp32 in master.pairs:
        assert fp32.dtype == torch.float32
        assert torch.equal(compute, fp32.to(torch.bfloat16))
    # Updates smaller than bf16's spacing accumulate in the master instead of vanishing.
    assert any(not torch.equal(fp32, compute.float()) for compute, fp32 in master.pairs)
