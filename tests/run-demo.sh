#!/bin/sh
# The README demo as a test: 4 worker processes, 100000 adds; wqdemo
# exits non-zero if any of its independent checks fails.
exec "${top_builddir:-.}/tools/wqdemo" --workers 4 --adds 100000 --name "t-demo-$$"
