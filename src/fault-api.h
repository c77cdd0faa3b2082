/*
 * fault-api.h - test-only interface of libwq-fault.la (never installed).
 * Tests that need crash points link libwq-fault.la instead of libwq.la.
 */
#ifndef WQ_FAULT_API_H
#define WQ_FAULT_API_H

#include <stdbool.h>
#include <stdint.h>

#define WQ_FAULT_KILL 0        /* raise(SIGKILL) at the point */
#define WQ_FAULT_EXIT 1        /* _exit(WQ_FAULT_EXIT_CODE) at the point */
#define WQ_FAULT_FAIL 2        /* a WQ_FAIL point reports failure instead */
#define WQ_FAULT_FAIL_ON 3     /* ... at the nth time and every time after,
                                  until disarmed (a full tmpfs, say) */
#define WQ_FAULT_HANG 4        /* stop there for good, making no progress
                                  (a walk caught in a cycle of pages), until
                                  someone kills the process */
#define WQ_FAULT_STOP 5         /* raise(SIGSTOP) at the point and go on
                                  when continued: the test does something
                                  meanwhile (waitid WSTOPPED, SIGCONT) */
#define WQ_FAULT_EXIT_CODE 86

/* Die at the nth time this process reaches `point` (NULL disarms).
   Returns 0 or -EINVAL. Not thread safe against concurrent arming. */
int wq_fault_arm(const char *point, unsigned nth, int how);
/* Start (clearing the list) or stop recording the points reached. */
void wq_fault_record(bool on);
/* Copy up to max recorded point names (static strings); returns count. */
int wq_fault_seen(const char **names, int max);

/* The test clock: once set, CLOCK_MONOTONIC readings of this process
   inside libwq return `now_ns` (advance it with further calls); 0 goes
   back to the real clock. Blocking waits still sleep in real time, so
   tests that use it call wq_get with timeout 0. Per process. */
void wq_test_clock_set(uint64_t now_ns);

#endif
