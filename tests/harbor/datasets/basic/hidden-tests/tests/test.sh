#!/bin/bash
if [ -f /app/seen.txt ] && [ ! -s /app/seen.txt ] && [ -f /tests/test.sh ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
