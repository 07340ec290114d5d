#!/bin/bash
# 1 when answer.txt in the working directory holds what the task asks for, else 0.
if [ "$(cat answer.txt 2>/dev/null)" = "1.17.0" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
