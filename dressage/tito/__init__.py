"""TITO (token in, token out): model profiles, exact tokenizers, chat templates, incremental ids."""

from dressage.tito.incremental import IndexedTurn, SegmentIndex, TitoPlan
from dressage.tito.profiles import ModelProfile, get_profile, profile_names, register_profile
from dressage.tito.qwen_profile import Qwen35Profile, Qwen36Profile
from dressage.tito.tokenizer import Tokenizer, load_qwen35_tokenizer
from dressage.tito.tool_calls import ParsedAssistant, parse_assistant_text

__all__ = [
    "IndexedTurn",
    "ModelProfile",
    "ParsedAssistant",
    "Qwen35Profile",
    "Qwen36Profile",
    "SegmentIndex",
    "TitoPlan",
    "Tokenizer",
    "get_profile",
    "load_qwen35_tokenizer",
    "parse_assistant_text",
    "profile_names",
    "register_profile",
]
