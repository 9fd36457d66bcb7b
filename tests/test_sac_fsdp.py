"""gpuopt's modules in today's distributed recipe: FSDP2 (gloo, 2 processes on CPU), each block compiled with
torch.compile(fullgraph=True), selective activation checkpointing that saves only the matmuls, so that our ops are
recomputed in the backward. One launch of two processes (tests/sac_fsdp_runs.py, which holds the model, the data, the
seeds and the mask check) trains one step of two models; this process runs the one-process reference meanwhile.

Why the reference is two one-process runs and not one on the whole batch: a dropout mask is keyed by the seed and
by the element's index in the tensor the op is given (Philox key = the seed, counter = the index's group of eight,
DESIGN 2.2), and rank 1 gives its ops its own rows, indices from 0. No seed makes those masks the whole
batch's masks of the same rows (a seed changes the key, never the counter). So each rank r draws its seeds from
torch.manual_seed(STEP_SEED + r), and the reference runs the same model, without FSDP2, compile or checkpointing,
on each rank's rows with that rank's seed: each rank's loss against its rows' loss, and the gradients (FSDP2's mean
over the ranks) against the mean of the two steps' gradients.
"""

import pytest
import sac_fsdp_runs as runs
import torch

from helpers import TESTS, TwoRanks

TIMEOUT = 240
TOL = 1e-5
# each block's recorded calls: attn_norm and mlp_norm (dropout_add_norm), the attention's LinearBiasAct (bias_act),
# the MLP's gated_act; the final norm runs outside the checkpointed blocks (one forward call, no recomputation)
BLOCK_OPS = ["gpuopt::dropout_add_norm", "gpuopt::bias_act", "gpuopt::dropout_add_norm", "gpuopt::gated_act"]
FORWARD_OPS = BLOCK_OPS * runs.BLOCKS + ["gpuopt::dropout_add_norm"]
DROPOUTS = FORWARD_OPS.count("gpuopt::dropout_add_norm") + FORWARD_OPS.count("gpuopt::gated_act")


def one_process(inner_seed=False, seeds=None):
    """(losses, gradients) of the reference: one-process steps (no FSDP2, no compile, no checkpointing) on each
    rank's rows with that rank's seed (or seeds[r]); the losses of the steps, the mean of their gradients."""
    model = runs.build_model(inner_seed, sac=False)
    losses = []
    for rank in range(runs.WORLD):
        loss = runs.loss_fn(model, rank, None if seeds is None else seeds[rank])
        (loss / runs.WORLD).backward()
        losses.append(loss.detach())
    return torch.stack(losses), {k: p.grad for k, p in model.named_parameters()}


def max_grad_diff(grads, ref):
    assert sorted(grads) == sorted(ref), (sorted(grads), sorted(ref))
    return max((grads[k] - ref[k]).abs().max().item() for k in ref)


@pytest.mark.slow
def test_fsdp2_compiled_blocks_with_selective_checkpointing(tmp_path):
    """One training step of each model under FSDP2 + per-block compile (fullgraph) + SAC (matmuls saved):
    (a) the gpuopt model's loss and every parameter's gradient are within 1e-5 of the one-process reference, and
        each rank drew the one-process run's dropout seeds;
    (b) every op the checkpoint recomputes in the backward (8 per rank: 2 blocks x 2 dropout_add_norm, bias_act,
        gated_act) takes the forward call's seed and gives its outputs bit for bit, so the same masks;
    (c) the negative control: in the model with gpuopt_test::dropout_inner_seed (its seed drawn inside the op),
        the same check reports each of its recomputations as another mask, and the gradients are off."""
    launch = TwoRanks(TESTS / "sac_fsdp_runs.py", tmp_path)
    try:  # the references run while the launch starts up
        ref_losses, ref_grads = one_process()
        bad_ref_losses, bad_ref_grads = one_process(inner_seed=True)
        other_losses, _ = one_process(seeds=[runs.STEP_SEED + 7, runs.STEP_SEED + 8])
        _, stderr = launch.communicate(timeout=TIMEOUT)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    assert launch.returncode == 0, stderr[-4000:]
    good = torch.load(tmp_path / "gpuopt.pt", weights_only=False)
    bad = torch.load(tmp_path / "inner_seed.pt", weights_only=False)

    # the compiler got each block whole: one graph per model (both blocks run it), the checkpointed region
    # (tag_activation_checkpoint) with our ops inside, and no graph break (fullgraph=True raises at one)
    for res in (good, bad):
        assert res["graph_breaks"] == {}, res["graph_breaks"]
        assert len(res["graphs"]) == 1, [g[:300] for g in res["graphs"]]
        code = res["graphs"][0]
        for needle in ("tag_activation_checkpoint", "gpuopt.dropout_add_norm", "gpuopt.bias_act", "gpuopt.gated_act"):
            assert needle in code, needle
    assert "gpuopt_test.dropout_inner_seed" in bad["graphs"][0]

    # (a) dropout changes the loss (a reference with other seeds is > 1e-4 away), and the step matches one process:
    # each rank's loss that of its rows, the gradients (FSDP2's mean over the ranks) the mean of the two
    assert (other_losses - ref_losses).abs().min() > 1e-4, "dropout must be on for the comparison to test the masks"
    assert (good["losses"] - ref_losses).abs().max() <= TOL, (good["losses"], ref_losses)
    diff = max_grad_diff(good["grads"], ref_grads)
    assert diff <= TOL, f"max |FSDP2 grad - one-process grad| = {diff:.3e}"
    for rank, records in enumerate(good["records"]):
        forward = [r for r in records if r["phase"] == "forward"]
        assert [r["op"] for r in forward] == FORWARD_OPS, [r["op"] for r in forward]
        seeds = [r["seed"][0] for r in forward if r["seed"] is not None]
        assert seeds == runs.expected_seeds(rank, DROPOUTS), f"rank {rank} drew other seeds than one process"
    assert runs.expected_seeds(0, DROPOUTS) != runs.expected_seeds(1, DROPOUTS), "the ranks draw their own masks"

    # (b) the recomputations in the backward
    for rank, records in enumerate(good["records"]):
        problems, checked = runs.check_recomputed_masks(records)
        assert problems == [], f"rank {rank}: " + "\n".join(problems)
        recomputed = sorted(r["op"] for r in records if r["phase"] == "backward")
        assert checked == len(recomputed) == len(BLOCK_OPS) * runs.BLOCKS, "SAC must recompute our ops"
        assert recomputed == sorted(BLOCK_OPS * runs.BLOCKS), recomputed

    # (c) the seed drawn inside the op: the same loss (the forward is the reference's), gradients off, and the
    # check reports every recomputation of the op as another mask (and the norm after it seeing other inputs), never
    # a seed of our ops
    assert (bad["losses"] - bad_ref_losses).abs().max() <= TOL, (bad["losses"], bad_ref_losses)
    bad_diff = max_grad_diff(bad["grads"], bad_ref_grads)
    assert bad_diff > 10 * TOL, f"a mask redrawn in the recomputation should skew the gradients: {bad_diff:.3e}"
    for rank, records in enumerate(bad["records"]):
        problems, _ = runs.check_recomputed_masks(records)
        flagged = [p for p in problems if p.startswith("gpuopt_test::dropout_inner_seed") and "another mask" in p]
        assert len(flagged) == runs.BLOCKS, f"rank {rank}: the check must flag the op in every block: {problems}"
        assert not any(p.startswith("gpuopt::") and "seed" in p for p in problems), problems
