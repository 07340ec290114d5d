"""The torch loss and backend, and slime rollout files (field names checked against slime's Sample)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dressage.errors import NotSupportedError, TrainingError
from dressage.integrations.slime import SlimeDumpBackend, slime_command, slime_rollout_command
from dressage.store import EventStore
from dressage.store.records import ConsumerCheckpoint, Run
from dressage.training import StepOptions, Trainer
from dressage.training.masking import MaskingPolicy
from dressage.training.torch_backend import (
    TINY_QWEN3_VOCAB,
    TorchBackend,
    build_model,
    checkpoint_metadata,
    ppo_clip_tis_loss,
    response_logprobs,
)
from tests.training.builders import SegmentSpec, TrajSpec, TurnSpec, build_run, simple

# every field of slime.utils.types.Sample at the pinned commit (Sample.to_dict keys)
SLIME_SAMPLE_FIELDS = {
    "group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs",
    "multimodal_train_inputs", "multimodal_train_input_id", "apply_chat_template_kwargs", "response",
    "response_length", "label", "reward", "loss_mask", "weight_versions", "rollout_log_probs",
    "rollout_top_p_token_ids", "rollout_top_p_token_offsets", "rollout_routed_experts", "remove_sample",
    "teacher_log_probs", "status", "metadata", "generate_function_path", "custom_rm_path",
    "train_metadata", "session_id", "non_generation_time", "spec_info", "prefix_cache_info",
}  # fmt: skip


def test_ppo_clip_tis_loss_hand_computed() -> None:
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    rollout = torch.tensor([-1.0, -2.0 - torch.log(torch.tensor(4.0)).item()])  # tis = 1, then 4 -> cap 2
    loss, stats = ppo_clip_tis_loss(logp, rollout, torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75]))
    # ratio = 1: pg = -A; L = sum w * tis * (-A) = -(0.25 * 1 + 0.75 * 2) * 0.5
    assert float(loss.detach()) == pytest.approx(-0.875)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([-0.125, -0.75])
    assert stats["tis_mean"] == pytest.approx(1.5)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_torch_backend_step_and_checkpoint(store: EventStore, run_name: str, tmp_path: Path) -> None:
    build_run(store, run_name, [[simple(1.0), simple(0.0)]])
    backend = TorchBackend(tmp_path / "ckpt", model="tiny-qwen3")
    [result] = Trainer(store, run_name, StepOptions(2, 2), backend).run_steps()
    assert result.metrics["loss"] == pytest.approx(result.metrics["loss"])  # finite
    meta = checkpoint_metadata(tmp_path / "ckpt" / "step-000001.safetensors")
    assert meta["run"] == run_name and meta["step"] == "1" and meta["batch_hash"] == result.batch.batch_hash
    with pytest.raises(NotSupportedError, match="push-to"):
        TorchBackend(tmp_path, push_to="http://127.0.0.1:30000")


def weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file."""
    from safetensors.torch import load_file

    return load_file(str(path))


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Same names, dtypes, shapes and bytes."""
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a
    )


class ForgetfulAdam(TorchBackend):
    """The behaviour before optimizer state was checkpointed: a resume restarts Adam's moments."""

    def resume(self, run: Run, checkpoint: ConsumerCheckpoint | None) -> None:
        super().resume(run, checkpoint)
        self.optimizer.state.clear()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_adam_stop_and_resume_is_bitwise_identical(store: EventStore, run_name: str, tmp_path: Path) -> None:
    """Weights after 2 + 2 steps (a new backend and model in between) equal 4 uninterrupted steps
    bit for bit: same CPU, same batches, same weights and Adam state in, same float operations.
    Restarting Adam's moments instead gives different weights, so the comparison can fail."""
    build_run(store, run_name, [[simple(float(g % 2), n_turns=1), simple(0.5)] for g in range(4)])
    opts = StepOptions(2, 2)

    def backend(out: str, cls: type[TorchBackend] = TorchBackend) -> TorchBackend:
        return cls(tmp_path / out, model="tiny-qwen3", optimizer="adam", lr=1e-2, seed=1)

    straight = Trainer(store, run_name, opts, backend("straight"), consumer="straight").run_steps()
    assert len(straight) == 4
    first = Trainer(store, run_name, opts, backend("resumed"), consumer="resumed").run_steps(max_steps=2)
    assert len(first) == 2
    second = backend("resumed")
    assert len(Trainer(store, run_name, opts, second, consumer="resumed").run_steps()) == 2
    final = weights(tmp_path / "straight" / "step-000004.safetensors")
    assert bitwise_equal(weights(tmp_path / "resumed" / "step-000004.safetensors"), final)
    assert bitwise_equal(
        weights(tmp_path / "resumed" / "optim-000004.safetensors"),
        weights(tmp_path / "straight" / "optim-000004.safetensors"),
    )
    assert float(second.optimizer.state_dict()["state"][0]["step"]) == 4.0  # Adam's step count went on
    assert not bitwise_equal(weights(tmp_path / "straight" / "step-000002.safetensors"), final)

    # control: the same resume with restarted moments drifts from the uninterrupted run
    Trainer(store, run_name, opts, backend("forgetful"), consumer="forgetful").run_steps(max_steps=2)
    Trainer(store, run_name, opts, backend("forgetful", ForgetfulAdam), consumer="forgetful").run_steps()
    assert not bitwise_equal(weights(tmp_path / "forgetful" / "step-000004.safetensors"), final)

    # a missing or mismatched optimizer file is refused, naming what to do
    (tmp_path / "resumed" / "optim-000004.safetensors").unlink()
    with pytest.raises(TrainingError, match=r"optim-000004.safetensors is missing.*--consumer"):
        Trainer(store, run_name, opts, backend("resumed"), consumer="resumed").run_steps()
    sgd = TorchBackend(tmp_path / "straight", model="tiny-qwen3", optimizer="sgd")
    with pytest.raises(TrainingError, match=r"holds adam state for .* this trainer runs sgd"):
        Trainer(store, run_name, opts, sgd, consumer="straight").run_steps()

    # pruning keeps the newest steps' weights and optimizer files together
    deleted = backend("straight").prune_checkpoints(1)
    assert sorted(p.name for p in deleted)[:2] == ["optim-000001.safetensors", "optim-000002.safetensors"]
    assert sorted(p.name for p in (tmp_path / "straight").iterdir()) == [
        "optim-000004.safetensors",
        "step-000004.safetensors",
    ]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_slime_dump_files(store: EventStore, run_name: str, tmp_path: Path) -> None:
    sub = TrajSpec(1.0, [SegmentSpec(0, [TurnSpec(4, 3)]), SegmentSpec(1, [TurnSpec(2, 2)], "subagent")])
    build_run(store, run_name, [[sub, simple(0.0)], [simple(1.0), simple(1.0)]])
    backend = SlimeDumpBackend(tmp_path / "dump")
    Trainer(store, run_name, StepOptions(4, 2), backend).run_steps()
    data = torch.load(tmp_path / "dump" / "0.pt", weights_only=False)
    assert data["rollout_id"] == 0
    samples = data["samples"]
    assert all(set(d) == SLIME_SAMPLE_FIELDS for d in samples)
    assert [(d["group_index"], d["rollout_id"]) for d in samples] == [(0, 0), (0, 0), (0, 1), (1, 2), (1, 3)]
    for d in samples:
        assert len(d["loss_mask"]) == len(d["rollout_log_probs"]) == d["response_length"]
        assert d["rollout_routed_experts"].shape == (len(d["tokens"]) - 1, 2, 2)
        assert d["rollout_routed_experts"].dtype == torch.int32 and d["status"] == "completed"
    # reward = advantage (broadcast) x G / (P x N_p): the prompt-equal weight for slime's reducer,
    # with N_p counted here from the dumped loss masks, P = 2 prompts, G = 4 trajectories per step
    n_p = {g: sum(sum(d["loss_mask"]) for d in samples if d["group_index"] == g) for g in (0, 1)}
    advantages = [0.5, 0.5, -0.5, 0.0, 0.0]
    assert [d["metadata"]["dressage_advantage"] for d in samples] == advantages
    for d, a in zip(samples, advantages, strict=True):
        assert d["reward"] == pytest.approx(a * 4 / (2 * n_p[d["group_index"]]))
    assert samples[2]["metadata"]["raw_reward"] == 0.0
    options = StepOptions(4, 2, masking=MaskingPolicy(max_staleness=1, last_version_only=True))
    cmd = slime_command(backend.pattern, options, 1)
    for part in (
        "--load-debug-rollout-data",
        "--debug-train-only",
        "--global-batch-size 4",
        "--rollout-batch-size 2",
        "--custom-pg-loss-reducer-function-path dressage.integrations.slime.prompt_equal_pg_loss_reducer",
        "--dressage-max-staleness 1 --dressage-last-version-only",
    ):
        assert part in cmd
    live = slime_rollout_command(run_name, options)
    assert "--rollout-function-path dressage.integrations.slime.generate_rollout" in live
    assert "--dressage-max-staleness 1 --dressage-last-version-only" in live
    assert f"--dressage-run {run_name}" in live


def test_generate_rollout_without_slime_says_what_to_do() -> None:
    from dressage.integrations.slime import generate_rollout

    try:
        import slime  # noqa: F401
    except ImportError:
        with pytest.raises(NotSupportedError, match="slime-dump"):
            generate_rollout(None, 0, None)
    else:
        pytest.skip("slime is installed here")


def test_response_logprobs_equal_those_of_the_full_pass_and_keep_their_gradient() -> None:
    """The trainer runs the output projection on the response's positions only (``logits_to_keep``):
    the logprobs, the log-distributions and the gradient equal those of a pass over every position, and
    a model whose forward lacks ``logits_to_keep`` gets the full pass."""
    model = build_model("tiny-qwen3", seed=3)
    tokens_L = torch.randint(0, TINY_QWEN3_VOCAB, (23,), generator=torch.Generator().manual_seed(5))
    R = 6
    logp_all_RV, logp_R = response_logprobs(model, tokens_L, R)
    logp_R.sum().backward()
    grad = model.lm_head.weight.grad.clone()
    model.zero_grad()
    full_LV = torch.log_softmax(model(input_ids=tokens_L[None]).logits[0].float(), dim=-1)
    expected_RV = full_LV[-R - 1 : -1]
    expected_R = expected_RV.gather(-1, tokens_L[-R:, None])[:, 0]
    expected_R.sum().backward()
    assert logp_all_RV.shape == (R, TINY_QWEN3_VOCAB) and logp_R.shape == (R,)
    torch.testing.assert_close(logp_all_RV, expected_RV, rtol=0, atol=1e-6)
    torch.testing.assert_close(logp_R, expected_R, rtol=0, atol=1e-6)
    torch.testing.assert_close(grad, model.lm_head.weight.grad, rtol=0, atol=1e-6)

    class WithoutLogitsToKeep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids: torch.Tensor) -> object:
            return self.inner(input_ids=input_ids)

    _, plain_R = response_logprobs(WithoutLogitsToKeep(), tokens_L, R)
    torch.testing.assert_close(plain_R, expected_R, rtol=0, atol=1e-6)
