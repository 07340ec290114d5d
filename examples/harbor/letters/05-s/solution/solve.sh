#!/bin/bash
mkdir -p /logs/agent
echo 'ss' | tee /logs/agent/answer.txt
