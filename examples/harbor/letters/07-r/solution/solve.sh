#!/bin/bash
mkdir -p /logs/agent
echo 'rr' | tee /logs/agent/answer.txt
