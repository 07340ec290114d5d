"""Profile selection: the run records the proxy's profile; a proxy with another profile is refused."""

from __future__ import annotations

from typing import Any

import pytest
from openai import APIStatusError, OpenAI

from dressage.errors import ConfigError
from dressage.tito.profiles import RUN_RECORD_KEY, get_profile
from tests.proxy.conftest import Harness
from tests.proxy.helpers import NOTHINK


def test_run_records_profile_and_a_restart_with_another_is_refused(proxy: Harness) -> None:
    run = proxy.run()
    recorded = proxy.store.runs.get(run).config[RUN_RECORD_KEY]
    assert recorded == {"model_profile": "qwen3.5", "template_sha256": get_profile("qwen3.5").template_hash}
    s = proxy.session(run)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]
    client = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model="m", messages=msgs, max_tokens=2, extra_body=NOTHINK)

    proxy.kwargs["profile"] = "qwen3.6"  # same vocabulary, another template
    proxy.restart()
    with pytest.raises(ConfigError, match=r"recorded with model profile 'qwen3\.5'"):
        proxy.loop.call(proxy.server.create_run(run, {}))
    with pytest.raises(ConfigError, match=r"restart it with --profile qwen3\.5"):
        proxy.session(run)
    client = OpenAI(base_url=f"{proxy.server.base_url}/s/{s.token}/v1", api_key="x", max_retries=0)
    with pytest.raises(APIStatusError) as e:
        client.chat.completions.create(model="m", messages=msgs, max_tokens=2, extra_body=NOTHINK)
    assert "recorded with model profile 'qwen3.5'" in str(e.value)
    assert len(proxy.store.turns.read(run, session_id=s.session_id)) == 1
    fresh = proxy.run()
    assert proxy.store.runs.get(fresh).config[RUN_RECORD_KEY]["model_profile"] == "qwen3.6"
