#!/bin/bash
id -un > answer.txt
