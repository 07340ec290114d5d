#!/bin/bash
echo notes > /app/notes.txt
