#!/bin/bash
tr a-z A-Z < /app/data.txt > /app/answer.txt
