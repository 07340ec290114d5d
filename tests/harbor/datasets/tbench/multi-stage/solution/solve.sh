#!/bin/bash
echo "$(cat /opt/sum.txt) $(cat /opt/notes.txt)" > answer.txt
