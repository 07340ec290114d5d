#!/bin/bash
mkdir -p /logs/agent
echo 'ii' | tee /logs/agent/answer.txt
