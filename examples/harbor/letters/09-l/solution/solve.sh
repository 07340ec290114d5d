#!/bin/bash
mkdir -p /logs/agent
echo 'll' | tee /logs/agent/answer.txt
