#!/bin/bash
mkdir -p /logs/agent
echo 'tt' | tee /logs/agent/answer.txt
