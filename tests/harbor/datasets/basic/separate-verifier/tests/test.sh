#!/bin/bash
if [ "$(cat /app/result.txt 2>/dev/null)" = 7 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
