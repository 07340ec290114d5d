#!/bin/bash
python3 -c 'import six; print(six.__version__)' > answer.txt
