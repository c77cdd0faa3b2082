#!/bin/sh
# The core, delay, rate-limit and crash suites again, with every queue
# they create in fair mode (WQ_TEST_FAIR, honoured by the test build of
# the library): fair mode must keep all of client-go's semantics, and the
# crash model orders re-added keys by the moment of their re-add.
set -u
b="${top_builddir:-.}/tests"
fail=0
for t in test-queue test-delay test-ratelimit test-crash; do
    if WQ_TEST_FAIR=1 "$b/$t" >"fair-$t.out" 2>&1; then
        echo "PASS: fair $t"
    else
        echo "FAIL: fair $t"; tail -40 "fair-$t.out"; fail=$((fail + 1))
    fi
    rm -f "fair-$t.out"
done
echo "fair: $((4 - fail)) passed, $fail failed"
[ "$fail" = 0 ]
