"""Losses against hand computations, and the gathered loss on two gloo processes.

The two-process test is the proof of the gradient-scaling decision in
:mod:`santa.method.distributed`: with ``all_gather_with_grad`` (gradient to every rank) and DDP's
plain gradient average, N workers reproduce the single-process loss and gradients on the
combined batch exactly. A local-only gather is run beside it to show the test can tell.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from santa.method.distributed import all_gather_with_grad, identity_gather, is_distributed
from santa.method.losses import (
    contrastive_loss,
    matryoshka_contrastive_loss,
    matryoshka_loss,
    mep_loss,
    similarity_scores,
    total_loss,
)
from tests.conftest import free_port

WORLD_SIZE = 2
LOCAL_BATCH = 3
HARD_PER_QUERY = 2
DIM_IN, DIM = 5, 4


def hand_infonce(
    queries: torch.Tensor, candidates: torch.Tensor, positives: list[int]
) -> tuple[float, torch.Tensor, torch.Tensor]:
    """InfoNCE with dot scores, written out: value, d/d queries, d/d candidates."""
    batch = len(queries)
    scores = [
        [float(queries[i] @ candidates[j]) for j in range(len(candidates))] for i in range(batch)
    ]
    probabilities = []
    loss = 0.0
    for i, row in enumerate(scores):
        top = max(row)
        exps = [math.exp(s - top) for s in row]
        total = sum(exps)
        probabilities.append([e / total for e in exps])
        loss += -(row[positives[i]] - top - math.log(total))
    loss /= batch
    # dL/dq_i = (sum_j p_ij c_j - c_pos(i)) / B ;  dL/dc_j = sum_i (p_ij - [j = pos(i)]) q_i / B
    grad_queries = torch.zeros_like(queries)
    grad_candidates = torch.zeros_like(candidates)
    for i in range(batch):
        for j in range(len(candidates)):
            weight = probabilities[i][j] - (1.0 if j == positives[i] else 0.0)
            grad_queries[i] += weight * candidates[j] / batch
            grad_candidates[j] += weight * queries[i] / batch
    return loss, grad_queries, grad_candidates


def test_contrastive_loss_matches_hand_computation() -> None:
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(3, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
    docs = torch.randn(3, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
    loss = contrastive_loss(queries, docs)
    loss.backward()
    value, grad_queries, grad_docs = hand_infonce(queries.detach(), docs.detach(), [0, 1, 2])
    assert loss.item() == pytest.approx(value, rel=1e-12)
    torch.testing.assert_close(queries.grad, grad_queries)
    torch.testing.assert_close(docs.grad, grad_docs)


def test_contrastive_loss_with_hard_negatives_matches_hand_computation() -> None:
    generator = torch.Generator().manual_seed(1)
    queries = torch.randn(2, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
    docs = torch.randn(2, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
    hard = torch.randn(4, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
    loss = contrastive_loss(queries, docs, hard)
    loss.backward()
    candidates = torch.cat([docs, hard]).detach()  # every query sees every hard negative
    value, grad_queries, grad_candidates = hand_infonce(queries.detach(), candidates, [0, 1])
    assert loss.item() == pytest.approx(value, rel=1e-12)
    torch.testing.assert_close(queries.grad, grad_queries)
    torch.testing.assert_close(docs.grad, grad_candidates[:2])
    torch.testing.assert_close(hard.grad, grad_candidates[2:])


def test_cosine_with_temperature() -> None:
    generator = torch.Generator().manual_seed(2)
    queries = torch.randn(3, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
    docs = torch.randn(3, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
    temperature = 0.05
    loss = contrastive_loss(queries, docs, similarity="cosine", temperature=temperature)
    unit_queries = queries.detach() / queries.detach().norm(dim=1, keepdim=True)
    unit_docs = docs.detach() / docs.detach().norm(dim=1, keepdim=True)
    # Cosine/τ is the dot product of unit vectors, one side scaled by 1/τ.
    value, _, _ = hand_infonce(unit_queries / temperature, unit_docs, [0, 1, 2])
    assert loss.item() == pytest.approx(value, rel=1e-10)
    assert torch.autograd.gradcheck(
        lambda q, d: contrastive_loss(q, d, similarity="cosine", temperature=temperature),
        (queries, docs),
    )
    with pytest.raises(ValueError, match="similarity"):
        similarity_scores(queries, docs, similarity="l2")


def test_matryoshka_loss_is_the_weighted_sum_of_the_losses_of_each_prefix() -> None:
    """Matryoshka over prefixes (8, 4, 2) with weights (1, 0.5, 2), cosine at τ 0.1 with
    hard negatives, against InfoNCE written out on each prefix (unit vectors of the cut
    embeddings) and summed by hand; the gradients equal those of the hand sum."""
    generator = torch.Generator().manual_seed(4)
    queries = torch.randn(3, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    docs = torch.randn(3, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    hard = torch.randn(3, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    dims, weights, temperature = (8, 4, 2), (1.0, 0.5, 2.0), 0.1
    loss = matryoshka_contrastive_loss(
        queries, docs, hard, dims=dims, weights=weights, similarity="cosine", temperature=0.1
    )
    loss.backward()
    value = 0.0
    grad_queries = torch.zeros_like(queries)
    for dim, weight in zip(dims, weights, strict=True):
        cut_queries = queries.detach()[:, :dim].clone().requires_grad_(True)
        unit_queries = cut_queries / cut_queries.norm(dim=1, keepdim=True)
        candidates = torch.cat([docs.detach(), hard.detach()])[:, :dim]
        unit_candidates = candidates / candidates.norm(dim=1, keepdim=True)
        part, _, _ = hand_infonce(unit_queries.detach() / temperature, unit_candidates, [0, 1, 2])
        value += weight * part
        # The hand value's gradient through the normalisation of the cut queries.
        scores = (unit_queries / temperature) @ unit_candidates.T
        torch.nn.functional.cross_entropy(scores, torch.arange(3)).mul(weight).backward()
        grad_queries[:, :dim] += cut_queries.grad
    assert loss.item() == pytest.approx(value, rel=1e-12)
    torch.testing.assert_close(queries.grad, grad_queries)
    # One prefix, weight 1: the plain loss of the cut vectors.
    cut = matryoshka_contrastive_loss(queries, docs, dims=(4,))
    assert cut.item() == pytest.approx(contrastive_loss(queries[:, :4], docs[:, :4]).item())
    # The generic wrapper around the same loss gives the same sum.
    wrapped = matryoshka_loss(
        lambda q, d, h: contrastive_loss(q, d, h, similarity="cosine", temperature=0.1),
        (queries, docs, hard),
        dims,
        weights,
    )
    assert wrapped.item() == pytest.approx(value, rel=1e-12)
    with pytest.raises(ValueError, match=r"dimensions \[16\] do not fit 8-dimensional"):
        matryoshka_contrastive_loss(queries, docs, dims=(16, 4))
    with pytest.raises(ValueError, match="2 Matryoshka weights for 3 dimensions"):
        matryoshka_contrastive_loss(queries, docs, dims=dims, weights=(1.0, 1.0))


def test_contrastive_loss_rejects_unpaired_batches() -> None:
    with pytest.raises(ValueError, match="pair up"):
        contrastive_loss(torch.randn(3, DIM), torch.randn(2, DIM))


def test_mep_loss_matches_hand_computation() -> None:
    generator = torch.Generator().manual_seed(3)
    vocab = 6
    logits = torch.randn(2, 3, vocab, generator=generator, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[4, 5, 1], [3, 1, -100]])  # last token of row 2 is padding
    loss = mep_loss(logits, labels)
    loss.backward()
    valid = [(b, t) for b in range(2) for t in range(3) if labels[b, t] != -100]
    expected_value = 0.0
    expected_grad = torch.zeros_like(logits)
    for b, t in valid:
        row = logits[b, t].detach()
        log_norm = math.log(sum(math.exp(float(x)) for x in row))
        expected_value += (log_norm - float(row[labels[b, t]])) / len(valid)
        # d/d logits of -log softmax = (softmax - one_hot) / number of counted tokens
        softmax = torch.tensor([math.exp(float(x) - log_norm) for x in row], dtype=torch.float64)
        softmax[labels[b, t]] -= 1.0
        expected_grad[b, t] = softmax / len(valid)
    assert loss.item() == pytest.approx(expected_value, rel=1e-12)
    torch.testing.assert_close(logits.grad, expected_grad)
    assert torch.all(logits.grad[1, 2] == 0)  # padding gets no gradient


def test_total_loss() -> None:
    sda, mep = torch.tensor(2.0, requires_grad=True), torch.tensor(3.0, requires_grad=True)
    loss = total_loss(sda, mep, mep_weight=0.5)
    loss.backward()
    assert loss.item() == 3.5
    assert (sda.grad.item(), mep.grad.item()) == (1.0, 0.5)
    assert total_loss(sda, None, 1.0) is sda
    assert total_loss(sda, mep, 0.0) is sda


def test_total_loss_without_sda_trains_mep_alone() -> None:
    sda, mep = torch.tensor(2.0, requires_grad=True), torch.tensor(3.0, requires_grad=True)
    loss = total_loss(sda, mep, mep_weight=1.0, sda_weight=0.0)
    loss.backward()
    assert loss.item() == 3.0
    # SDA stays in the graph with a zero gradient (DDP sees every parameter used).
    assert (sda.grad.item(), mep.grad.item()) == (0.0, 1.0)
    assert total_loss(sda, mep, 0.5, sda_weight=2.0).item() == 5.5


def test_identity_gather_and_no_process_group() -> None:
    tensor = torch.randn(3, DIM)
    assert identity_gather(tensor) == (tensor, 0)
    assert not is_distributed()
    gathered, offset = all_gather_with_grad(tensor)
    assert gathered is tensor and offset == 0


# --------------------------------------------------------------------------- two processes


def make_global_batch() -> dict[str, torch.Tensor]:
    """Inputs of the combined batch; rank r takes rows [r*B, (r+1)*B) (hard: r*B*n ...)."""
    generator = torch.Generator().manual_seed(7)
    rows = WORLD_SIZE * LOCAL_BATCH
    return {
        "weight": torch.randn(DIM, DIM_IN, generator=generator, dtype=torch.float64),
        "queries": torch.randn(rows, DIM_IN, generator=generator, dtype=torch.float64),
        "docs": torch.randn(rows, DIM_IN, generator=generator, dtype=torch.float64),
        "hard": torch.randn(
            rows * HARD_PER_QUERY, DIM_IN, generator=generator, dtype=torch.float64
        ),
    }


def run_step(
    batch: dict[str, torch.Tensor], gather, rank: int, local_batch: int, wrap=lambda m: m
) -> dict[str, torch.Tensor]:
    """One step of a shared linear encoder on this rank's rows: loss and gradients."""
    encoder = torch.nn.Linear(DIM_IN, DIM, bias=False, dtype=torch.float64)
    with torch.no_grad():
        encoder.weight.copy_(batch["weight"])
    model = wrap(encoder)
    local = slice(rank * local_batch, (rank + 1) * local_batch)
    hard_rows = local_batch * HARD_PER_QUERY
    hard_local = slice(rank * hard_rows, (rank + 1) * hard_rows)
    queries = batch["queries"][local].clone().requires_grad_(True)
    docs = batch["docs"][local].clone().requires_grad_(True)
    hard = batch["hard"][hard_local].clone().requires_grad_(True)
    # One forward through the (DDP-wrapped) encoder, as a training step does.
    embeddings = model(torch.cat([queries, docs, hard]))
    query_embeddings, doc_embeddings, hard_embeddings = embeddings.split(
        [len(queries), len(docs), len(hard)]
    )
    loss = contrastive_loss(query_embeddings, doc_embeddings, hard_embeddings, gather=gather)
    loss.backward()
    return {
        "loss": loss.detach(),
        "weight_grad": encoder.weight.grad.clone(),  # after DDP's average when wrapped
        "queries_grad": queries.grad,
        "docs_grad": docs.grad,
        "hard_grad": hard.grad,
    }


def local_only_gather(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The tempting wrong gather: plain all_gather, gradient to this rank's rows only."""
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.detach())
    parts[dist.get_rank()] = tensor
    return torch.cat(parts), dist.get_rank() * len(tensor)


def distributed_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """One gloo rank: the step with all_gather_with_grad under DDP, and the wrong gather."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        batch = make_global_batch()

        def wrap(module):
            return torch.nn.parallel.DistributedDataParallel(module)

        results = run_step(batch, all_gather_with_grad, rank, LOCAL_BATCH, wrap)
        wrong = run_step(batch, local_only_gather, rank, LOCAL_BATCH, wrap)
        results["wrong_weight_grad"] = wrong["weight_grad"]
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_gathered_loss_on_two_processes_equals_single_process(tmp_path: Path) -> None:
    mp.spawn(
        distributed_worker,
        args=(WORLD_SIZE, free_port(), str(tmp_path)),
        nprocs=WORLD_SIZE,
        join=True,
    )
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(WORLD_SIZE)]

    # The single-process reference: every row on one process, no gathering.
    reference_step = run_step(
        make_global_batch(), identity_gather, rank=0, local_batch=WORLD_SIZE * LOCAL_BATCH
    )

    # Loss value: the average of the per-rank losses (each a mean over local queries).
    mean_loss = sum(r["loss"] for r in ranks) / WORLD_SIZE
    torch.testing.assert_close(mean_loss, reference_step["loss"])

    # Parameters: DDP's average over ranks is the single-process gradient, on every rank.
    for r in ranks:
        torch.testing.assert_close(r["weight_grad"], reference_step["weight_grad"])

    # Inputs: each rank's input gradient is the sum over all ranks' losses; divided by N
    # (DDP-style averaging) it is the single-process gradient of those rows.
    for key in ("queries_grad", "docs_grad", "hard_grad"):
        combined = torch.cat([r[key] for r in ranks]) / WORLD_SIZE
        torch.testing.assert_close(combined, reference_step[key])

    # The gather that sends gradient to the local rows only misses the other ranks'
    # terms: its averaged gradient is wrong, so the test above can tell the two apart.
    wrong = ranks[0]["wrong_weight_grad"]
    assert not torch.allclose(wrong, reference_step["weight_grad"])
    assert not torch.allclose(wrong * WORLD_SIZE, reference_step["weight_grad"])


def test_scores_and_softmax_stay_fp32_under_bf16_autocast() -> None:
    """Under autocast the matmul would run in bf16 (2-3 significant digits): the loss on
    raw dot products of large vectors must equal the fp32 loss, not a rounded one."""
    torch.manual_seed(0)
    queries = torch.randn(16, 256)  # raw dot products in the tens
    docs = 0.1 * queries + torch.randn(16, 256)
    negatives = torch.randn(32, 256)
    expected = contrastive_loss(queries, docs, negatives)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        got = contrastive_loss(queries, docs, negatives)
        scores = similarity_scores(queries, docs)
    assert got.dtype == torch.float32 and scores.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    # The same computation left to autocast is measurably off: the guard is doing work.
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        rounded = torch.nn.functional.cross_entropy(
            torch.cat([queries @ docs.T, queries @ negatives.T], dim=1), torch.arange(16)
        )
    assert abs(rounded.float().item() - expected.item()) > 1e-3


def test_mep_loss_of_a_batch_without_entities_is_zero_not_nan() -> None:
    logits = torch.randn(2, 3, 10, requires_grad=True)
    loss = mep_loss(logits, torch.full((2, 3), -100))
    assert loss.item() == 0.0
    loss.backward()  # still part of the graph (DDP expects every step to backprop)
    assert torch.equal(logits.grad, torch.zeros_like(logits))
