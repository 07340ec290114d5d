#!/bin/bash
mkdir -p /logs/agent
echo 'ee' | tee /logs/agent/answer.txt
