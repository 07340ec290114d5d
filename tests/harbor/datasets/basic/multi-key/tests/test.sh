#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then
  echo '{"reward": 0.75, "correct": 1, "style": 0.5}' > /logs/verifier/reward.json
else
  echo '{"reward": 0, "correct": 0, "style": 0.5}' > /logs/verifier/reward.json
fi
