/*
 * fault.h - named crash points for the fault-injection test build.
 *
 * Every store that changes shared state inside a critical section is
 * separated from the next by WQ_STEP("component.step"). In a build
 * configured with --enable-fault-injection, a test arms one point with
 * wq_fault_arm() and the process kills itself (SIGKILL, or _exit) when it
 * reaches that point, so crash tests can stop a lock holder between any
 * two mutations. In release builds the macro is a compiler barrier only.
 *
 * WQ_FAIL("component.what") marks a call whose failure the code handles
 * but a test cannot provoke (a mutex attribute the system refuses): armed
 * with WQ_FAULT_FAIL, it reports a failure at its n-th occurrence. False
 * in release builds.
 */
#ifndef WQ_FAULT_H
#define WQ_FAULT_H

#include <stdbool.h>

#ifdef WQ_FAULT_INJECTION
void wq__fault_hit(const char *point);
bool wq__fault_fail(const char *point);
#define WQ_FAULT(point) wq__fault_hit(point)
#define WQ_FAIL(point) wq__fault_fail(point)
#else
#define WQ_FAULT(point) ((void)(point))
#define WQ_FAIL(point) false
#endif

#endif
