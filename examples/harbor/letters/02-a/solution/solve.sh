#!/bin/bash
mkdir -p /logs/agent
echo 'aa' | tee /logs/agent/answer.txt
