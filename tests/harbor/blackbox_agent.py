"""A blackbox CLI for the Harbor fixtures: one chat completion through ``OPENAI_BASE_URL`` (the proxy,
reached through the sandbox's forwarder), then the instruction's ``sh`` block. Run inside the sandbox
by the ``command`` agent as ``python3 -I -S -c "$(cat ...)"``-style code; stdlib only."""

import json
import os
import re
import subprocess
import urllib.request

base = os.environ["OPENAI_BASE_URL"].rstrip("/")
body = {
    "model": os.environ.get("OPENAI_MODEL", "m"),
    "messages": [{"role": "user", "content": os.environ["DRESSAGE_PROMPT"]}],
    "max_tokens": 4,
}
req = urllib.request.Request(
    base + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
)
with urllib.request.urlopen(req, timeout=60) as resp:
    reply = json.load(resp)["choices"][0]["message"]["content"] or ""
block = re.search(r"```sh\n(.*?)```", os.environ["DRESSAGE_PROMPT"], re.S)
subprocess.run(["/bin/sh", "-c", block.group(1)], check=True)
print(reply)
