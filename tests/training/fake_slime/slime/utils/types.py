"""``slime.utils.types.Sample`` as seen by a rollout function (interface of slime 624b824a)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

import torch


@dataclass
class Sample:
    """One training sample; field names, order, types and defaults as in slime's ``Sample``."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | torch.Tensor | None = None
    rollout_top_p_token_offsets: list[int] | torch.Tensor | None = None
    rollout_routed_experts: list[list[int]] | torch.Tensor | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        """Generation outcome."""

        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo:
        """Speculative-decoding counters."""

        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        def to_dict(self) -> dict[str, int]:
            return {f.name: getattr(self, f.name) for f in fields(self)}

        @staticmethod
        def from_dict(data: dict[str, int]) -> Sample.SpecInfo:
            return Sample.SpecInfo(**{f.name: data.get(f.name, 0) for f in fields(Sample.SpecInfo)})

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo:
        """Prefix-cache counters."""

        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        def to_dict(self) -> dict[str, int]:
            return {f.name: getattr(self, f.name) for f in fields(self)}

        @staticmethod
        def from_dict(data: dict[str, int]) -> Sample.PrefixCacheInfo:
            cls = Sample.PrefixCacheInfo
            return cls(**{f.name: data.get(f.name, 0) for f in fields(cls)})

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self) -> dict[str, Any]:
        """Every field; ``status`` as its value, the info objects as dicts."""
        out = dict(self.__dict__)
        out["status"] = self.status.value
        out["spec_info"] = self.spec_info.to_dict()
        out["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Sample:
        """The inverse of :meth:`to_dict`; keys that are not fields become attributes."""
        data = dict(data)
        data["status"] = Sample.Status(data["status"])
        data["spec_info"] = Sample.SpecInfo.from_dict(data.get("spec_info", {}))
        data["prefix_cache_info"] = Sample.PrefixCacheInfo.from_dict(data.get("prefix_cache_info", {}))
        names = {f.name for f in fields(Sample)}
        sample = Sample(**{k: v for k, v in data.items() if k in names})
        for k, v in data.items():
            if k not in names:
                setattr(sample, k, v)
        return sample
