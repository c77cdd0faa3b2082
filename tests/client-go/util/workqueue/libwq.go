// Package workqueue is client-go's util/workqueue API (the part that
// client-go's queue_test.go uses) implemented on libwq, so that the
// test file, copied unchanged from client-go, runs against libwq.
//
// Every queue behaviour comes from libwq: the FIFO, the dirty and
// processing sets, coalescing, blocking Get, shutdown and drain all live
// in the libwq region. This file only translates:
//
//   - Items are Go values, libwq keys are byte strings. Each queue keeps
//     an intern table: an item gets a key the first time it is added
//     ("s/" + the string for a plain string that fits, "#<n>" for anything
//     else) and keeps it while libwq holds the key (queued or
//     processing). Two items get the same key exactly when they are ==,
//     since the table is a Go map keyed by the item. An entry is dropped
//     once libwq reports the key idle (wq_result says neither PENDING nor
//     RUNNING) and no call of this queue is using it, so a done item can
//     be garbage collected (TestGarbageCollection).
//   - Each New* creates a fresh queue, "<prefix>-<pid>-<n>" (prefix:
//     $WQ_GO_QUEUE_PREFIX, default t-client-go), with
//     WQ_CREATE|WQ_EXCL and unlinks its name at once: the region lives
//     as long as the handle maps it, and nothing is left in /dev/shm
//     even if the test binary dies. The handle is closed when the Go
//     queue is garbage collected.
//   - Documented differences (wq.h, "Differences from client-go"): Done
//     of an item that is not processing is -ENOENT, ignored here (client-go
//     would queue a second copy of a dirty item); an Add after shutdown is
//     -ESHUTDOWN, ignored as client-go ignores it; a drain ended by
//     ShutDown is -ECANCELED, client-go's forced shutdown. Every other
//     error, a full queue (-ENOSPC) included, panics.
//   - TypedQueueConfig.Queue is not the storage here (the region is), so
//     its Push, Pop and Len are never called. Its Touch hook is called
//     when an Add coalesces into a queued item (wq_add returns 1 and
//     wq_result says PENDING), the case in which client-go calls it.
//     MetricsProvider and Clock are absent: libwq keeps its metrics in
//     the region (wq_metrics) and uses CLOCK_MONOTONIC.
//   - Type parameters are constrained by any, not comparable as in
//     client-go: Go 1.19 (Debian 12) does not let any satisfy comparable,
//     and the test instantiates Queue[any]. Items are keyed as any(item),
//     so a non-comparable item panics at run time, as client-go's sets
//     would.
package workqueue

/*
#cgo LDFLAGS: -lwq
#include <stdlib.h>
#include <wq.h>
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Deprecated: Interface is deprecated, use TypedInterface instead.
type Interface TypedInterface[any]

type TypedInterface[T any] interface {
	Add(item T)
	Len() int
	Get() (item T, shutdown bool)
	Done(item T)
	ShutDown()
	ShutDownWithDrain()
	ShuttingDown() bool
}

// Queue is client-go's pluggable storage interface. Only Touch is used
// (see the package comment).
type Queue[T any] interface {
	Touch(item T)
	Push(item T)
	Len() int
	Pop() (item T)
}

// DefaultQueue is client-go's slice based FIFO, for callers that build a
// Queue of their own on it (TestCollapse's traceQueue does).
func DefaultQueue[T any]() Queue[T] {
	return new(queue[T])
}

type queue[T any] []T

func (q *queue[T]) Touch(item T) {}

func (q *queue[T]) Push(item T) {
	*q = append(*q, item)
}

func (q *queue[T]) Len() int {
	return len(*q)
}

func (q *queue[T]) Pop() (item T) {
	item = (*q)[0]
	(*q)[0] = *new(T)
	*q = (*q)[1:]
	return item
}

// Deprecated: use TypedQueueConfig instead.
type QueueConfig = TypedQueueConfig[any]

type TypedQueueConfig[T any] struct {
	// Name is client-go's metrics name; kept for the API, unused.
	Name string
	// Queue gets Touch calls (see the package comment); may be nil.
	Queue Queue[T]
}

// Deprecated: use NewTyped instead.
func New() *Type {
	return NewWithConfig(QueueConfig{})
}

// Deprecated: use NewWithConfig instead.
func NewNamed(name string) *Type {
	return NewWithConfig(QueueConfig{Name: name})
}

func NewTyped[T any]() *Typed[T] {
	return NewTypedWithConfig(TypedQueueConfig[T]{})
}

// Deprecated: use NewTypedWithConfig instead.
func NewWithConfig(config QueueConfig) *Type {
	return NewTypedWithConfig(config)
}

var queueSeq atomic.Uint64

func NewTypedWithConfig[T any](config TypedQueueConfig[T]) *Typed[T] {
	prefix := os.Getenv("WQ_GO_QUEUE_PREFIX")
	if prefix == "" {
		prefix = "t-client-go"
	}
	// Under tests/with-redis.sh: the queues live on its private server.
	redis := strings.HasPrefix(os.Getenv("WQ_TEST_PREFIX"), "redis://")
	if redis {
		prefix = os.Getenv("WQ_TEST_PREFIX") + prefix
	}
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), queueSeq.Add(1))
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var o C.struct_wq_options
	o.flags = C.WQ_CREATE | C.WQ_EXCL
	var h *C.wq
	if rc := C.wq_open(cname, &o, &h); rc < 0 {
		fail("wq_open "+name, rc)
	}
	// Unlinked at once: nothing is left behind whatever the test does. A
	// Redis queue's unlink deletes it (the server goes away at the end).
	if !redis {
		if rc := C.wq_unlink(cname); rc < 0 {
			C.wq_close(h)
			fail("wq_unlink "+name, rc)
		}
	}
	maxKey := int(C.wq_max_key_len(h))
	if maxKey <= 0 {
		C.wq_close(h)
		fail("wq_max_key_len "+name, C.int(maxKey))
	}
	q := &Typed[T]{
		h:      h,
		name:   name,
		maxKey: maxKey,
		hook:   config.Queue,
		byItem: map[any]*entry[T]{},
		byKey:  map[string]*entry[T]{},
	}
	runtime.SetFinalizer(q, func(q *Typed[T]) { C.wq_close(q.h) })
	return q
}

// Deprecated: Use Typed instead.
type Type = Typed[any]

type Typed[T any] struct {
	h      *C.wq
	name   string
	maxKey int
	hook   Queue[T]

	mu     sync.Mutex // guards the intern table and hook calls
	byItem map[any]*entry[T]
	byKey  map[string]*entry[T]
	nextID uint64
}

type entry[T any] struct {
	item T
	key  string
	refs int // Add and Done calls of this queue using the key now
}

func fail(what string, rc C.int) {
	panic(fmt.Sprintf("libwq: %s: %s (%d)", what, C.GoString(C.wq_strerror(rc)), int(rc)))
}

// cbytes passes a key to C; the slice must outlive the call.
func cbytes(b []byte) (unsafe.Pointer, C.size_t) {
	return unsafe.Pointer(&b[0]), C.size_t(len(b))
}

// acquire finds or makes item's entry and pins it until release.
func (q *Typed[T]) acquire(item T, create bool) *entry[T] {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.byItem[any(item)]
	if e == nil {
		if !create {
			return nil
		}
		var key string
		if s, ok := any(item).(string); ok && len(s)+2 <= q.maxKey {
			key = "s/" + s
		} else {
			q.nextID++
			key = "#" + strconv.FormatUint(q.nextID, 10)
		}
		e = &entry[T]{item: item, key: key}
		q.byItem[any(item)] = e
		q.byKey[key] = e
	}
	e.refs++
	return e
}

// state asks libwq what it holds of key (C.WQ_STATE_*).
func (q *Typed[T]) state(key []byte) C.enum_wq_state {
	var r C.struct_wq_result
	p, n := cbytes(key)
	if rc := C.wq_result(q.h, p, n, &r); rc < 0 {
		fail("wq_result "+q.name, rc)
	}
	return r.state
}

func live(s C.enum_wq_state) bool {
	return s == C.WQ_STATE_PENDING || s == C.WQ_STATE_RUNNING
}

// release unpins e and drops it once no call uses it and libwq holds the
// key no more. Under q.mu with refs == 0 nothing of this queue can make
// the key live again, and a key libwq does not hold cannot be handed out.
func (q *Typed[T]) release(e *entry[T]) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e.refs--
	if e.refs == 0 && !live(q.state([]byte(e.key))) {
		delete(q.byItem, any(e.item))
		delete(q.byKey, e.key)
	}
}

// Add marks item as needing processing (wq_add). After shutdown the item
// is ignored, as in client-go.
func (q *Typed[T]) Add(item T) {
	e := q.acquire(item, true)
	defer q.release(e)
	key := []byte(e.key)
	p, n := cbytes(key)
	rc := C.wq_add(q.h, p, n)
	switch {
	case rc == 1 && q.hook != nil:
		if q.state(key) == C.WQ_STATE_PENDING {
			q.mu.Lock()
			q.hook.Touch(item)
			q.mu.Unlock()
		}
	case rc == 0, rc == 1, rc == -C.ESHUTDOWN:
	default:
		fail("wq_add "+q.name, rc)
	}
	runtime.KeepAlive(q)
}

// Len is the number of queued items (wq_len).
func (q *Typed[T]) Len() int {
	rc := C.wq_len(q.h)
	if rc < 0 {
		fail("wq_len "+q.name, rc)
	}
	runtime.KeepAlive(q)
	return int(rc)
}

// Get blocks until an item is queued (wq_get); shutdown is true once the
// queue is shutting down and nothing is queued.
func (q *Typed[T]) Get() (item T, shutdown bool) {
	buf := make([]byte, q.maxKey)
	p, n := cbytes(buf)
	rc := C.wq_get(q.h, p, n, -1)
	if rc == -C.ESHUTDOWN {
		return item, true
	}
	if rc <= 0 {
		fail("wq_get "+q.name, rc)
	}
	key := string(buf[:rc])
	q.mu.Lock()
	e := q.byKey[key]
	q.mu.Unlock()
	runtime.KeepAlive(q)
	if e == nil {
		panic(fmt.Sprintf("libwq: wq_get %s handed out key %q, which this queue never added", q.name, key))
	}
	return e.item, false
}

// Done ends the processing of item (wq_done); if it was added again
// meanwhile libwq queues it again.
func (q *Typed[T]) Done(item T) {
	e := q.acquire(item, false)
	if e == nil {
		return // never added, or long done: wq_done would say -ENOENT
	}
	defer q.release(e)
	p, n := cbytes([]byte(e.key))
	if rc := C.wq_done(q.h, p, n); rc < 0 && rc != -C.ENOENT {
		fail("wq_done "+q.name, rc)
	}
	runtime.KeepAlive(q)
}

// ShutDown stops the queue (wq_shutdown); it also ends a pending drain.
func (q *Typed[T]) ShutDown() {
	if rc := C.wq_shutdown(q.h); rc < 0 {
		fail("wq_shutdown "+q.name, rc)
	}
	runtime.KeepAlive(q)
}

// ShutDownWithDrain stops the queue and waits until no item is
// processing (wq_shutdown_drain), or until a ShutDown ends the wait.
func (q *Typed[T]) ShutDownWithDrain() {
	if rc := C.wq_shutdown_drain(q.h, -1); rc < 0 && rc != -C.ECANCELED {
		fail("wq_shutdown_drain "+q.name, rc)
	}
	runtime.KeepAlive(q)
}

func (q *Typed[T]) ShuttingDown() bool {
	r := bool(C.wq_shutting_down(q.h))
	runtime.KeepAlive(q)
	return r
}
