#!/bin/bash
mkdir -p /logs/agent
echo 'dd' | tee /logs/agent/answer.txt
