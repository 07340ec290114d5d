"""Model profiles by name: the registry, and what a run records about the profile that served it.

The profile interface is :class:`~dressage.tito.model_profile.ModelProfile`. The families live in
their own modules (:mod:`dressage.tito.qwen_profile`, :mod:`dressage.tito.deepseek_profile`,
:mod:`dressage.tito.mistral_profile`) and are registered here by name, imported only when first
asked for; others register with :func:`register_profile`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dressage.errors import ConfigError
from dressage.tito.model_profile import FullRenderer, ModelProfile, PromptRenderer

__all__ = [
    "RUN_RECORD_KEY",
    "FullRenderer",
    "ModelProfile",
    "PromptRenderer",
    "build_profile",
    "check_run_profile",
    "get_profile",
    "profile_names",
    "profile_record",
    "register_profile",
]


def _qwen(name: str) -> ModelProfile:
    from dressage.tito.qwen_profile import Qwen35Profile, Qwen36Profile

    if name.startswith("qwen3.6"):
        return Qwen36Profile(preserve_thinking=name.endswith("-preserve"))
    return Qwen35Profile(thinking=not name.endswith("-nothink"))


def _deepseek() -> ModelProfile:
    from dressage.tito.deepseek_profile import DeepSeekV3Profile

    return DeepSeekV3Profile()


def _mistral() -> ModelProfile:
    from dressage.tito.mistral_profile import MistralNemoProfile

    return MistralNemoProfile()


_REGISTRY: dict[str, Callable[[], ModelProfile]] = {
    "qwen3.5": lambda: _qwen("qwen3.5"),
    "qwen3.5-nothink": lambda: _qwen("qwen3.5-nothink"),
    "qwen3.6": lambda: _qwen("qwen3.6"),
    "qwen3.6-preserve": lambda: _qwen("qwen3.6-preserve"),
    "deepseek-v3": _deepseek,
    "mistral-nemo": _mistral,
}
_INSTANCES: dict[str, ModelProfile] = {}


RUN_RECORD_KEY = "tito"
"""Key of a run's config snapshot under which the proxy records the model profile it served."""


def profile_record(profile: ModelProfile) -> dict[str, str]:
    """What a run records about the profile that rendered its prompts: name and template sha256."""
    return {"model_profile": profile.name, "template_sha256": profile.template_hash}


def check_run_profile(run_name: str, config: Mapping[str, object], profile: ModelProfile) -> None:
    """Refuse to serve run ``run_name`` with ``profile`` when its config recorded another one.

    A run's token ids only mean something under the template and vocabulary that produced them;
    a proxy restarted with another profile must not continue it. Runs without a record (created
    outside a proxy) are accepted.
    """
    recorded = config.get(RUN_RECORD_KEY)
    if recorded is None or recorded == profile_record(profile):
        return
    name = recorded.get("model_profile") if isinstance(recorded, Mapping) else recorded
    raise ConfigError(
        f"run {run_name!r} was recorded with model profile {name!r} ({recorded}); this proxy serves "
        f"{profile.name!r} (template sha256 {profile.template_hash}): restart it with --profile {name}"
    )


def register_profile(name: str, factory: Callable[[], ModelProfile]) -> None:
    """Make a profile available to :func:`get_profile` under ``name``."""
    _REGISTRY[name] = factory
    _INSTANCES.pop(name, None)


def profile_names() -> list[str]:
    """Registered profile names."""
    return sorted(_REGISTRY)


def build_profile(name: str) -> ModelProfile:
    """A new, unshared instance of the profile registered as ``name`` (the built-in profiles' tokenizer
    is still the process's one for its vocabulary file: :meth:`~dressage.tito.tokenizer.Tokenizer.shared`)."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model profile {name!r}; known: {', '.join(profile_names())}")
    return _REGISTRY[name]()


def get_profile(name: str) -> ModelProfile:
    """The (shared) profile registered as ``name``; raises :class:`ConfigError` if unknown."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model profile {name!r}; known: {', '.join(profile_names())}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _REGISTRY[name]()
    return _INSTANCES[name]
