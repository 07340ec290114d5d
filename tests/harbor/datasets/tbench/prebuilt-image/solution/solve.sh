#!/bin/bash
tool hello > answer.txt
