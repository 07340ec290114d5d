#!/bin/bash
mkdir -p /logs/agent
echo 'oo' | tee /logs/agent/answer.txt
