#!/bin/bash
mkdir -p /logs/agent
echo 'uu' | tee /logs/agent/answer.txt
