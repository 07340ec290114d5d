#!/bin/bash
ls -A /tests > /app/seen.txt
