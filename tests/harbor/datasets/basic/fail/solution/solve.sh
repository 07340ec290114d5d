#!/bin/bash
echo goodbye > /app/greeting.txt  # a wrong reference solution: this task must score 0
