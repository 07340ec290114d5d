"""The RL loop trains with torch: without the 'engine' extra these drills skip (fail under
``DRESSAGE_REQUIRE_ALL=1``)."""

from tests.conftest import require_module

require_module("torch", "the loop trains with torch (the 'engine' extra)")
