#!/bin/bash
mkdir -p /logs/agent
echo 'nn' | tee /logs/agent/answer.txt
