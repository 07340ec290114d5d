#!/bin/bash
mkdir -p /logs/agent
echo 'cc' | tee /logs/agent/answer.txt
