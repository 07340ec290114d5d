#!/bin/bash
. /etc/os-release
printf '%s\n%s\n' "$(id -un)" "$VERSION_ID" > answer.txt
