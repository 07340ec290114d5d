#!/bin/bash
# The agent's final answer is /logs/agent/answer.txt (dressage writes it; a Harbor agent writes it itself).
if grep -qi -- 'l' /logs/agent/answer.txt 2>/dev/null; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
