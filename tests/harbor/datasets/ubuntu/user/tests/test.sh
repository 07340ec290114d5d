#!/bin/bash
# 1 when answer.txt holds "runner" and "24.04" and the image is Ubuntu 24.04 run as runner, else 0.
. /etc/os-release
if [ "$ID" = ubuntu ] && [ "$(id -un)" = runner ] && [ "$(printf 'runner\n24.04')" = "$(cat answer.txt 2>/dev/null)" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
