"""The torch loss and backend, and slime rollout files (field names checked against slime's Sample)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dressage.errors import NotSupportedError
from dressage.integrations.slime import SlimeDumpBackend, slime_command
from dressage.store import EventStore
from dressage.training import StepOptions, Trainer
from dressage.training.torch_backend import TorchBackend, checkpoint_metadata, ppo_clip_tis_loss
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
    assert [d["reward"] for d in samples[:3]] == [0.5, 0.5, -0.5]  # advantage, broadcast
    assert samples[2]["metadata"]["raw_reward"] == 0.0
    cmd = slime_command(backend.pattern, StepOptions(4, 2), 1)
    for part in (
        "--load-debug-rollout-data",
        "--debug-train-only",
        "--global-batch-size 4",
        "--rollout-batch-size 2",
    ):
        assert part in cmd


def test_generate_rollout_without_slime_says_what_to_do() -> None:
    from dressage.integrations.slime import generate_rollout

    try:
        import slime  # noqa: F401
    except ImportError:
        with pytest.raises(NotSupportedError, match="slime-dump"):
            generate_rollout(None, 0, None)
    else:
        pytest.skip("slime is installed here")
