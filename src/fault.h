/*
 * fault.h - named crash points for the fault-injection test build.
 *
 * Every store that changes shared state inside a critical section is
 * separated from the next by WQ_STEP("component.step"). In a build
 * configured with --enable-fault-injection, a test arms one point with
 * wq_fault_arm() and the process kills itself (SIGKILL, or _exit) when it
 * reaches that point, so crash tests can stop a lock holder between any
 * two mutations. In release builds the macro is a compiler barrier only.
 */
#ifndef WQ_FAULT_H
#define WQ_FAULT_H

#ifdef WQ_FAULT_INJECTION
void wq__fault_hit(const char *point);
#define WQ_FAULT(point) wq__fault_hit(point)
#else
#define WQ_FAULT(point) ((void)0)
#endif

#endif
